"""The 4-bit GEMV at M = 1 for NVIDIA Hopper with its weight streamed by TMA through a shared-memory ring.

Why a third 4-bit kernel at M = 1, a hypothesis to test: the register-fed GEMV (gemv_w4_sm90.py) loads a program's
K tile of words into registers, so the bytes an SM has in flight are bounded by its register file (three programs of
128 threads x 8 rows x 16 bytes: ~48 KB) and fall to nothing while a program sums its tile and the next one starts.
At ~1.5 us of loaded latency that would cap the read near 2.5-2.8 TB/s whatever the GPU's bandwidth: at Llama-3-8B's
gate_up it measured 2.46 TB/s on an H100 (3.35 peak) and 2.84 on an H200 (4.8), where the bf16 skinny GEMM, fed
by TMA, reads 3.0 and 4.1. Its decode is not what binds it: 2.2 sm90 instructions a weight for int4 in half
pairs (scripts/sass_loop_mix.py --gluon --half2 --one-tile), ~7.7 us of issue at gate_up on an H200 against
~13 us of HBM.

Here a persistent program walks row blocks of BLOCK_N rows (blocks pid, pid + G, ...), each in K steps of
STEP_W words (2,048 columns), and a ring of STAGES shared-memory stages that TMA fills keeps STAGES - 1 steps
in flight (16 KB of words each, with their scales and zero points) while the warps decode the current one from
shared memory exactly as the register-fed kernel decodes its tile (gemv_w4_sm90._accumulate in half pairs): the
same [BLOCK_N, GPI, WPG] register layout, read from the stage instead of global memory. The activation row is
staged in shared memory once a program (its largest |a|, the half pairs' factor, taken on the way), so every
row block reuses it. Weights and their scales are constants: the ring's first steps are requested before the
PDL wait, under the previous kernel's tail.

TMA asks for 16-byte aligned rows: the word view's rows (K / 2 bytes) and the scales' (K / GROUP_K elements);
shapes without them (gpt-oss's K = 2,880 in MXFP4: 90-byte scale rows) stay on the register-fed kernel, as do
the float32 decode (half pairs only here) and the gated MLP's interleaved rows.

Measured on an H100 (session 48, experiments/quant4/README.md): correct, but at best level with the register-fed
kernel (Llama-3-8B int4 at plan 2:4: qkv 8.1 / o 6.6 / gate_up 24.9 / down 16.9 us against 7.9 / 6.5 / 23.5 /
17.4; deeper rings with fewer programs an SM were slower, 8:1 gate_up 29.4): there the register-fed kernel already
reads 92% of what bf16 cuBLAS reads. The H200, where it reads 2.84 TB/s against the TMA-fed bf16 GEMM's 4.1, is
untimed. So opt-in: TRITONLLM_W4_GEMV_TMA=1 (the default plan), or
TRITONLLM_W4_GEMV_TMA="STAGES:PROGRAMS_PER_SM" for sweeps.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from tritonllm import platform
from tritonllm.kernels import gemv_w4, gemv_w4_sm90
from tritonllm.kernels.gemm_skinny_sm90 import unswizzled_descriptor
from tritonllm.kernels.launch import compile_gluon_sm90, gluon_barrier, gluon_pdl_wait, gluon_sm90_available

try:  # recent triton ships Gluon; without it the other GEMVs serve every shape
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier

    from tritonllm.kernels.gemm_skinny_sm90 import _tma_load, release_ring, ring_barriers

    HAVE_GLUON = gemv_w4_sm90.HAVE_GLUON
except ImportError:  # pragma: no cover - older triton
    HAVE_GLUON = False

NUM_WARPS = gemv_w4_sm90.NUM_WARPS
WPT = gemv_w4_sm90.WPT
ROWS = 8  # weight rows a thread (as the register-fed kernel's tilings)
WARPS_K = 2  # warps along K: BLOCK_N = 16 rows of 256 words a step, one TMA box (256 is TMA's widest box)
BLOCK_N = ROWS * (NUM_WARPS // WARPS_K)
STEP_W = 256  # words a step: GPI groups of WPG words, whatever the group (32 // (WPG / WPT) x WARPS_K x WPG)
MAX_K = 32768  # the staged activation row's shared memory (64 KB of bf16 at most)


@dataclass(frozen=True)
class Plan:
    # the H100's best of 3:3, 4:2, 6:2, 2:4, 2:5, 2:6, 8:1 (session 48; 2:5 ties it): more programs, shallower rings
    stages: int = 2  # ring stages: STAGES - 1 steps of 16 KB in flight a program
    programs_per_sm: int = 4  # the persistent grid: at most this many programs an SM (shared memory and registers)

    @classmethod
    def parse(cls, text: str) -> Plan:
        """ "STAGES:PROGRAMS_PER_SM"."""
        return cls(*(int(v) for v in text.split(":")))


_SETTING = os.environ.get("TRITONLLM_W4_GEMV_TMA", "0")
ENABLED = _SETTING != "0"
PLAN = Plan.parse(_SETTING) if ":" in _SETTING else Plan()


def steps_of(k: int) -> int:
    """K steps of STEP_W words (8 columns a word) a row block."""
    return -(-k // (STEP_W * 8))


def _rows_aligned(t: torch.Tensor) -> bool:
    """TMA's rule for a [R, C] tensor: unit column stride, 16-byte aligned base and row stride."""
    return t.dim() == 2 and t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0


def takes(a: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, group_k: int,
          fp4: bool) -> bool:  # fmt: skip
    """Whether this kernel serves a [1, K] activation against the word view [N, K / 8] with scales [N, K /
    group_k] (and int4 zero points, the scales' shape): switched on (ENABLED), the register-fed kernel's shapes in
    half pairs, TMA-aligned rows, K within MAX_K, an sm90 GPU."""
    k = a.shape[1]
    return (
        ENABLED and gemv_w4_sm90.takes(a, k, group_k) and gemv_w4_sm90.half2_on() and k <= MAX_K
        and words.dtype == torch.int32 and _rows_aligned(words) and _rows_aligned(scale)
        and (fp4 or (zero is not None and zero.dtype == scale.dtype and _rows_aligned(zero)))
        and available()
    )  # fmt: skip


@functools.cache
def available() -> bool:
    """Whether this machine runs the kernel (gemv_w4_sm90.available's rules, for this kernel's builds)."""
    return gluon_sm90_available(
        HAVE_GLUON,
        "W4 TMA GEMV",
        "the register-fed Gluon GEMV serves 4-bit GEMVs instead",
        lambda: compile_sm90(fp4=False),
        lambda: compile_sm90(fp4=True),
    )


def _groups_a_step(group_k: int) -> int:
    """GPI: scale groups a step (STEP_W words of group_k / 8 words a group)."""
    return STEP_W // (group_k // 8)


def w4_gemv_tma_sm90(a: torch.Tensor, words: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None,
                     scale: torch.Tensor, zero: torch.Tensor | None, group_k: int, fp4: bool, pdl: dict,
                     plan: Plan | None = None) -> torch.Tensor:  # fmt: skip
    """c[0] = a[0] . w^T (+ bias) as gemv_w4_sm90.w4_gemv_sm90 computes it (its half pairs' decode), for the
    shapes takes() accepts."""
    plan = plan or PLAN
    n, k = words.shape[0], a.shape[1]
    gpi = _groups_a_step(group_k)
    masks = gemv_w4.HALF2_MASKS if fp4 else gemv_w4.INT4_HALF2_MASKS
    blocks = -(-n // BLOCK_N)
    grid = (max(1, min(blocks, plan.programs_per_sm * platform.num_multiprocessors())),)
    s_desc = unswizzled_descriptor(scale, [BLOCK_N, gpi])
    w4_gemv_tma_sm90_kernel[grid](
        a, unswizzled_descriptor(words, [BLOCK_N, STEP_W]), s_desc, unswizzled_descriptor(zero, [BLOCK_N, gpi]) if zero is not None else s_desc,
        c, bias if bias is not None else c, n, k, *masks, FP4=fp4, GROUP_K=group_k, STAGES=plan.stages,
        KT=steps_of(k), HAS_BIAS=bias is not None, num_warps=NUM_WARPS, **pdl,
    )  # fmt: skip
    return c


def compile_sm90(fp4: bool, group_k: int | None = None, k: int = 4096, stages: int | None = None):
    """Compile the kernel for sm90 without a GPU (Triton's own compiler and ptxas): tests, available()."""
    group_k = group_k or (32 if fp4 else 128)
    gpi = _groups_a_step(group_k)
    scale_dtype = torch.uint8 if fp4 else torch.bfloat16
    w_desc = unswizzled_descriptor(torch.empty((BLOCK_N, STEP_W), dtype=torch.int32), [BLOCK_N, STEP_W])
    s_desc = unswizzled_descriptor(torch.empty((BLOCK_N, 64), dtype=scale_dtype), [BLOCK_N, gpi])
    from triton.runtime.jit import mangle_type

    constexprs = dict(FP4=fp4, GROUP_K=group_k, STAGES=stages or PLAN.stages, KT=steps_of(k), HAS_BIAS=False,
                      PDL=True)  # fmt: skip
    types = dict(a_ptr="*bf16", w_desc=mangle_type(w_desc), s_desc=mangle_type(s_desc), z_desc=mangle_type(s_desc),
                 c_ptr="*bf16", bias_ptr="*bf16")  # fmt: skip
    return compile_gluon_sm90(w4_gemv_tma_sm90_kernel, constexprs, types, ("a_ptr", "c_ptr", "K"),
                              num_warps=NUM_WARPS)  # fmt: skip


if HAVE_GLUON:
    _WARPS = gl.constexpr(NUM_WARPS)
    _WPT = gl.constexpr(WPT)
    _ROWS = gl.constexpr(ROWS)
    _WARPS_K = gl.constexpr(WARPS_K)
    _STEP_W = gl.constexpr(STEP_W)

    @gluon.jit
    def _issue_step(w_desc, s_desc, z_desc, w_smem, s_smem, z_smem, ready, j, steps, pid, programs,
                    KT: gl.constexpr, STAGES: gl.constexpr, GPI: gl.constexpr, FP4: gl.constexpr):  # fmt: skip
        """Step j's words, scales and (int4) zero points into its stage (none past the program's last step):
        row block pid + (j // KT) x programs, K step j % KT."""
        stage = j % STAGES
        pred = j < steps
        BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
        row = (pid + (j // KT) * programs) * BLOCK_N
        kt = j % KT
        bar = ready.index(stage)
        S_BYTES: gl.constexpr = BLOCK_N * GPI * s_desc.dtype.primitive_bitwidth // 8
        mbarrier.expect(bar, BLOCK_N * _STEP_W * 4 + (1 if FP4 else 2) * S_BYTES, pred=pred)
        _tma_load(w_desc, [row, kt * _STEP_W], bar, w_smem.index(stage), pred=pred)
        _tma_load(s_desc, [row, kt * GPI], bar, s_smem.index(stage), pred=pred)
        if not FP4:
            _tma_load(z_desc, [row, kt * GPI], bar, z_smem.index(stage), pred=pred)

    @gluon.jit
    def w4_gemv_tma_sm90_kernel(
        a_ptr, w_desc, s_desc, z_desc, c_ptr, bias_ptr, N, K, m0, m1,
        FP4: gl.constexpr, GROUP_K: gl.constexpr, STAGES: gl.constexpr, KT: gl.constexpr, HAS_BIAS: gl.constexpr,
        PDL: gl.constexpr = False,
    ):  # fmt: skip
        """c[0, n] = sum_k a[0, k] w[n, k] (+ bias) over the row blocks pid, pid + G, ... of BLOCK_N rows, each in
        KT steps of STEP_W words through a ring of STAGES TMA stages (module docstring). w_desc: the word view [N,
        K / 8], boxes [BLOCK_N, STEP_W]; s_desc, z_desc: scales and (int4) zero points [N, K / GROUP_K], boxes
        [BLOCK_N, GPI] (z_desc unused for MXFP4); m0, m1: gemv_w4's HALF2_MASKS / INT4_HALF2_MASKS. Rows past N and
        columns past K arrive as TMA's zeros (their activations are zeros too, so they add nothing)."""
        WPG: gl.constexpr = GROUP_K // 8
        GPI: gl.constexpr = _STEP_W // WPG
        BLOCK_N: gl.constexpr = _ROWS * (_WARPS // _WARPS_K)
        L4: gl.constexpr = gemv_w4_sm90._layout(_ROWS, WPG, _WPT, _WARPS_K)
        L3: gl.constexpr = gl.SliceLayout(3, L4)  # [BLOCK_N, GPI, WPG] words
        LG: gl.constexpr = gl.SliceLayout(2, L3)  # [BLOCK_N, GPI] scales, zero points
        LA: gl.constexpr = gl.SliceLayout(0, L4)  # [GPI, WPG, 8] activations
        LW: gl.constexpr = gl.SliceLayout(0, L3)
        LR: gl.constexpr = gemv_w4_sm90._runs_layout(_ROWS, WPG, _WPT, _WARPS_K)
        # the words as a stage holds them, [BLOCK_N, STEP_W] row-major: a thread's ROWS rows x WPT words, the lanes
        # along a row's words, the warps WARPS_K along K: L3's registers, rows and lanes, before the split of K
        # into groups
        LS: gl.constexpr = gl.BlockedLayout([_ROWS, _WPT], [1, 32], [_WARPS // _WARPS_K, _WARPS_K], [1, 0])

        pid = gl.program_id(0)
        programs = gl.num_programs(0)
        steps = gl.cdiv(gl.cdiv(N, BLOCK_N) - pid, programs) * KT

        w_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, _STEP_W], w_desc.layout)
        s_smem = gl.allocate_shared_memory(s_desc.dtype, [STAGES, BLOCK_N, GPI], s_desc.layout)
        z_smem = s_smem
        if not FP4:
            z_smem = gl.allocate_shared_memory(z_desc.dtype, [STAGES, BLOCK_N, GPI], z_desc.layout)
        ready = ring_barriers(STAGES)
        for i in gl.static_range(STAGES - 1):  # constants: requested before the wait for the previous kernel
            _issue_step(w_desc, s_desc, z_desc, w_smem, s_smem, z_smem, ready, i, steps, pid, programs, KT, STAGES,
                        GPI, FP4)  # fmt: skip
        gluon_pdl_wait(PDL)

        # the activation row into shared memory, K step by K step, and its largest |a|
        a_smem = gl.allocate_shared_memory(a_ptr.dtype.element_ty, [KT, GPI, WPG, 8],
                                           gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))  # fmt: skip
        a_ptrs, ga, ja = gemv_w4_sm90._act_pointers(a_ptr, GROUP_K, _ROWS, _WARPS_K)
        amax = gl.zeros([GPI, WPG, 8], gl.float32, layout=LA)
        for i in gl.static_range(KT):
            act = gemv_w4_sm90._load_act(a_ptrs, i * _STEP_W, K // 8, ga, WPG, True)
            amax = gl.maximum(amax, gl.abs(act.to(gl.float32)))
            a_smem.index(i).store(act)
        amax = gl.max(gl.max(gl.max(amax, axis=2), axis=1), axis=0)
        col_scale, out_scale = gemv_w4_sm90.half2_factors(gemv_w4_sm90._exp_field(amax), ja, FP4)
        gluon_barrier()  # the row stored before any warp reads it

        acc, acc_z = gemv_w4_sm90._zero_accumulators(BLOCK_N, GPI, WPG, FP4, L3, LG, LR, True)
        rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LG))
        for t in range(steps):
            # the stage read at step t - 1 is free once every warp is past that step: refill it, STAGES - 1 ahead
            gluon_barrier()
            _issue_step(w_desc, s_desc, z_desc, w_smem, s_smem, z_smem, ready, t + STAGES - 1, steps, pid, programs,
                        KT, STAGES, GPI, FP4)  # fmt: skip
            stage = t % STAGES
            kt = t % KT
            mbarrier.wait(ready.index(stage), (t // STAGES) & 1)
            words = gl.convert_layout(gl.reshape(w_smem.index(stage).load(LS), [BLOCK_N, GPI, WPG]), L3)
            s = s_smem.index(stage).load(LG)
            z = s
            if not FP4:
                z = z_smem.index(stage).load(LG)
            act = a_smem.index(kt).load(LA)
            acc, acc_z = gemv_w4_sm90._accumulate(words, act, s, z, acc, acc_z, col_scale, m0, m1, FP4, LW, LG, LR,
                                                  True)  # fmt: skip
            if kt == KT - 1:  # the row block's last step: its sums out, the accumulators zeroed for the next
                out = gemv_w4_sm90._finish(acc, acc_z, out_scale, FP4, LG, True)
                n_out = (pid + (t // KT) * programs) * BLOCK_N + rows
                if HAS_BIAS:
                    out += gl.load(bias_ptr + n_out, mask=n_out < N).to(gl.float32)
                gl.store(c_ptr + n_out, out.to(c_ptr.dtype.element_ty), mask=n_out < N)
                acc, acc_z = gemv_w4_sm90._zero_accumulators(BLOCK_N, GPI, WPG, FP4, L3, LG, LR, True)
        release_ring(ready, STAGES)
