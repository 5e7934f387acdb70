"""Low-overhead launches of hot-path Triton kernels.

`fn[grid](*args)` costs about 19 us of host time on the H200 machine's CPU (2026-11-29, triton
3.6): Triton binds and specialises every argument, hashes a cache key and checks globals on every
call. A hot-path kernel is launched call after call with the same specialisation, so `Launcher`
keeps the compiled kernel under a key the caller builds once (per step, say) and launches it
through the compiled kernel's own launcher (about 8.5 us measured on the same machine).

The caller's key must determine what Triton specialises on in the runtime arguments: their dtypes,
16-byte alignment of pointers (`aligned`), integers equal to 1 or divisible by 16 (`int_spec`), and
a tensor descriptor's dtype and block shape. Launcher adds the rest itself (constexpr values, warps,
stages, device). A key that is finer than Triton's only costs an extra slow launch.

On the interpreter (CPU), with a launch hook installed (profilers), or for a kernel whose
constexprs are not its last parameters, every launch takes the ordinary path.

Programmatic dependent launch (PDL, NVIDIA Hopper and newer): a kernel launched with it may start
while the kernel before it in the stream is still running, so the launch and the ramp-up of each of
a decode step's ~300 small kernels overlap the tail of the one before instead of following it (also
inside CUDA graphs, which record the launch attribute). A kernel opts in with a last parameter
`PDL: tl.constexpr` and `pdl_wait(PDL)` before its first global memory access: it waits there until
the previous kernel has finished and its writes are visible, then lets the next kernel launch.
`Launcher` passes PDL itself; direct `fn[grid](...)` launches add `**pdl_launch()`. The engine
switches it with `EngineConfig.pdl` (`set_pdl`); elsewhere (ROCm, older GPUs, the interpreter)
PDL is False and the kernels compile without it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from tritonllm import platform  # isort: skip  (on CPU it switches on the interpreter before triton loads)

import torch
import triton
import triton.language as tl

try:  # triton >= 3.4
    from triton import knobs
except ImportError:  # pragma: no cover - older triton: always the ordinary path
    knobs = None

_FAST = platform.is_gpu() and knobs is not None
# the backends' own default pipelining depth (the AMD backend takes no num_stages=None)
DEFAULT_NUM_STAGES = 2 if platform.PLATFORM == "rocm" else 3


def pdl_supported() -> bool:
    """NVIDIA compute capability 9.0+ and a Triton that launches with the PDL attribute."""
    if platform.PLATFORM != "cuda" or platform.is_interpreter():
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:  # pragma: no cover
        return False
    return "launch_pdl" in CUDAOptions.__dataclass_fields__ and torch.cuda.get_device_capability() >= (9, 0)


_PDL = [False]  # set by the engine (set_pdl); a list so that kernel modules see the change


def set_pdl(enabled: bool) -> bool:
    """Launch PDL-aware kernels with programmatic dependent launch from now on (where supported);
    returns whether it is on."""
    _PDL[0] = bool(enabled) and pdl_supported()
    return _PDL[0]


def pdl_on() -> bool:
    return _PDL[0]


def pdl_launch() -> dict[str, bool]:
    """Keyword arguments of a direct launch of a PDL-aware kernel: its PDL constexpr and, when on,
    Triton's launch option."""
    return {"PDL": True, "launch_pdl": True} if _PDL[0] else {"PDL": False}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """With PDL: wait until the previous kernel in the stream has finished (its writes visible),
    then allow the next one to launch. Call before the kernel's first global load or store."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


# Arrival counters of kernels whose programs count themselves in and let the last one finish the
# work (the split-K GEMMs' sums, split-KV attention's merge): one zeroed int32 tensor per device that
# every such kernel leaves at zero. Kernels touch them only after pdl_wait, so two never share them.
_ARRIVAL_COUNTERS: dict[torch.device, torch.Tensor] = {}
MAX_ARRIVAL_COUNTERS = 1 << 16


def arrival_counters(device: torch.device) -> torch.Tensor | None:
    """The device's counters, allocated on first use; None while a CUDA graph is being captured before
    they exist (an allocation there would be zeroed only on replay; the engine's warm-ups run eagerly
    first, and the decode graphs' capture, worker/cuda_graph.py, allocates them before its first graph)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0" name one device: one set of counters
        device = torch.device("cuda", torch.cuda.current_device())
    counters = _ARRIVAL_COUNTERS.get(device)
    if counters is None and not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        counters = _ARRIVAL_COUNTERS[device] = torch.zeros(MAX_ARRIVAL_COUNTERS, dtype=torch.int32, device=device)
    return counters


try:  # the same wait for Gluon kernels (kernels/*_sm90.py), which call only Gluon functions
    from triton.experimental import gluon
    from triton.experimental.gluon import language as _gl

    gluon_pdl_wait = gluon.jit(pdl_wait.fn)
    # the CTA-wide barrier of the Gluon kernels: Triton 3.6 (the H200 machine's) names it barrier, 3.9 thread_barrier
    gluon_barrier = getattr(_gl, "thread_barrier", None) or _gl.barrier
except ImportError:  # pragma: no cover - older triton
    gluon_pdl_wait = gluon_barrier = None


def gluon_sm90_available(have_gluon: bool, what: str, fallback: str, *probes: Callable[[], object]) -> bool:
    """Whether this machine runs a kernels/*_sm90.py Gluon kernel: an NVIDIA sm90 GPU, a Triton with Gluon
    (`have_gluon`), and every probe (a compile of the kernel) passing. Gluon's API is experimental: a
    version that breaks the kernel leaves its work to the portable kernels, with a warning naming `what`
    and `fallback`, instead of failing a step."""
    if not have_gluon or platform.PLATFORM != "cuda" or torch.cuda.get_device_capability(platform.DEVICE)[0] != 9:
        return False
    try:
        for probe in probes:
            probe()
    except Exception as failure:  # noqa: BLE001 - any compiler error means: use the portable kernels
        warnings.warn(
            f"{what}: the sm90 Gluon kernel does not compile with this Triton ({failure!r:.300}); {fallback}",
            stacklevel=3,
        )
        return False
    return True


def compile_gluon_sm90(fn, constexprs: dict, types: dict[str, str], aligned: Sequence[str], **options):
    """Compile Gluon kernel `fn` for sm90 without a GPU (Triton's own compiler and ptxas): `constexprs`
    its constexpr values, `types` its other parameters' types (those not named: "i32"), `aligned` the
    parameters specialised as divisible by 16; `options` the compile options (num_warps, maxnreg, ...).
    Returns the compiled kernel (its .asm holds the IR, PTX and cubin): the kernels/*_sm90.py modules'
    compile_sm90 (their availability probes, tests, scripts/sass_loop_mix.py)."""
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    names = fn.arg_names
    signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in names}
    source = GluonASTSource(fn, signature, {(names.index(k),): v for k, v in constexprs.items()},
                            {(names.index(n),): [["tt.divisibility", 16]] for n in aligned})  # fmt: skip
    return triton_compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def _hooked() -> bool:
    """Whether a launch hook (a profiler's) is installed: such launches take the ordinary path.
    Newer Triton keeps hooks in an always-present HookChain; older Triton a callable or None."""
    hook = knobs.runtime.launch_enter_hook
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else hook is not None


def int_spec(*values: int) -> tuple:
    """What Triton specialises an integer argument on: == 1, divisible by 16, and its width."""
    return tuple((v == 1, v % 16 == 0, -(2**31) <= v < 2**31) for v in values)


def aligned(*tensors: torch.Tensor | None) -> tuple[bool, ...]:
    """Per tensor, whether its data pointer is 16-byte aligned (Triton's pointer specialisation, made
    per argument: one flag for all would let a kernel compiled with q aligned and k not be reused for
    k aligned and q not, its vector loads then misaligned). None (an absent optional pointer): True."""
    return tuple(t is None or t.data_ptr() & 15 == 0 for t in tensors)


class Launcher:
    """Launches one @triton.jit kernel; `key` names the runtime arguments' specialisation, which the
    caller vouches for (None: always the ordinary path)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self._compiled: dict[Hashable, tuple[Any, tuple]] = {}
        self.pdl_aware = "PDL" in fn.arg_names  # a last constexpr PDL (module docstring)

    def __call__(
        self,
        key: Hashable,
        grid: tuple[int, ...],
        args: Sequence[Any],
        constexprs: dict[str, Any],
        *,
        num_warps: int,
        num_stages: int,
        device_index: int = 0,
    ) -> None:
        options = {}
        if self.pdl_aware:
            constexprs = {**constexprs, "PDL": _PDL[0]}
            if _PDL[0]:
                options["launch_pdl"] = True
        if key is not None:
            key = (key, tuple(constexprs.values()), num_warps, num_stages, device_index)
        entry = self._compiled.get(key) if _FAST and key is not None else None
        if entry is None or _hooked():
            compiled = self.fn[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages, **options)
            if _FAST and key is not None and list(constexprs) == self.fn.arg_names[len(args) :]:
                self._compiled[key] = (compiled, tuple(constexprs.values()))
            return
        compiled, constexpr_values = entry
        grid = (*grid, 1, 1)
        compiled.run(
            grid[0], grid[1], grid[2], torch._C._cuda_getCurrentRawStream(device_index), compiled.function,
            compiled.packed_metadata, None, None, None, *args, *constexpr_values,
        )  # fmt: skip
