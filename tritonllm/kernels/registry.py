"""The kernel registry: every op's implementations by name, what each supports, and the per-engine
selection that the layers call through.

An op is a family of entry points that one implementation provides together (the `rms_norm` op:
`rms_norm` and `fused_add_rms_norm`; `attention`: `plan_attention` and `paged_attention`). A file
that implements an op registers each entry point where it defines it:

    @register("rms_norm", "triton", supports=Supports(dtypes=FLOATS), priority=10)
    def rms_norm(x, weight, eps): ...

Every module of `tritonllm.kernels` is imported on first use, so a new file registers itself.
`select_kernels({"rms_norm": "torch_ref"}, context)` returns a `Kernels`: the chosen entry points,
"auto" taking the highest-priority implementation that supports the context. Engines own their
`Kernels` and bind them to their model's layers (`bind_kernels`), so two engines in one process
may choose differently. An impossible choice (an unknown name, a dtype or platform the
implementation does not support) raises ValueError naming what is available.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

# op -> the entry points an implementation must provide
OPS: dict[str, tuple[str, ...]] = {
    "attention": ("plan_attention", "paged_attention"),
    "rms_norm": ("rms_norm", "fused_add_rms_norm", "rms_norm_quant"),
    "rotary": ("rotary_embedding",),
    "activation": ("silu_and_mul", "silu_and_mul_quant"),
    "kv_write": ("write_kv_cache",),
    # RoPE of q, k and the KV-cache write of the rotated k and v in one entry point (one kernel)
    "rope_kv_write": ("rotary_write_kv_cache",),
    # apply_penalties: presence / frequency / repetition penalties on some rows, in place, before `sample`;
    # apply_token_bitmask: a structured output's disallowed tokens to -inf on some rows, in place
    "sampling": ("sample", "log_softmax", "apply_penalties", "apply_token_bitmask"),
    "linear": (
        "linear",
        "quantized_linear",
        "gated_linear",
        "silu_mul_linear",
        "norm_linear",
        "residual_linear",
        "gated_mlp_linear",
        "input_quant",
    ),
    "moe": ("moe_route", "fused_moe", "router_route", "norm_router_route"),
}
# entry points an implementation may leave out: fused kernels only some implementations have. Left out,
# the entry returns None and its caller runs the unfused ops (linear's gated_linear: gate_up's GEMM with
# the SiLU-mul in its epilogue; without it, the GEMM and then the activation op)
# linear's silu_mul_linear: the down projection of silu(gate) * up given gate_up's output, the SiLU-mul
# and the down GEMM quantizing its own input; without it, the activation op (quantizing) and the GEMM);
# norm_linear: a layer applied to the RMSNorm of the residual stream, normalized and quantized in its GEMM
# (without it, the norm kernel and the GEMM); residual_linear: a layer whose output is added into the
# residual stream in its GEMM's epilogue (without it, the GEMM, and the add in the next norm's kernel);
# gated_mlp_linear: a gated MLP's two GEMMs with the SiLU-mul and the down input's quantization inside them
# (without it, gate_up, the activation op, down); moe's router_route: a MoE router's linear layer and the
# routing in one kernel at decode sizes (without it, the router's GEMM, then moe_route); moe's norm_router_route: the
# decoder layer's residual add and RMSNorm before the block in router_route's launch (without it, the norm kernel,
# then router_route); linear's input_quant: how
# the op before should quantize a layer's input where the implementation takes another form than the scheme's
# (without it, None: the scheme's own)
OPTIONAL_ENTRIES: dict[str, frozenset[str]] = {
    "linear": frozenset(
        {"gated_linear", "silu_mul_linear", "norm_linear", "residual_linear", "gated_mlp_linear", "input_quant"}
    ),
    "moe": frozenset({"router_route", "norm_router_route"}),
}
ENTRY_OPS: dict[str, str] = {entry: op for op, entries in OPS.items() for entry in entries}
FLOATS = frozenset({torch.float32, torch.float16, torch.bfloat16})
PLATFORMS = frozenset({"cuda", "rocm", "cpu"})  # platform.PLATFORM; cpu: Triton kernels run under the interpreter


@dataclass(frozen=True)
class Supports:
    """What an implementation runs: activation dtypes, KV cache dtypes and head sizes (None: any),
    platforms, and named features (e.g. "split_kv", "fp8_kv") for documentation and selection."""

    dtypes: frozenset[torch.dtype] | None = None
    kv_dtypes: frozenset[torch.dtype] | None = None
    head_sizes: frozenset[int] | None = None
    platforms: frozenset[str] = PLATFORMS
    features: frozenset[str] = frozenset()
    # its launches can be captured into CUDA/HIP graphs (no host synchronisation, no data-dependent
    # shapes); an engine that chose one that cannot runs the graphs that would hold it eagerly
    graphs: bool = True
    # linear implementations: the quantized formats served (kernels/quant_formats.py format names,
    # e.g. "fp8:block:group"); None: every one. Unquantized layers are every implementation's.
    linear_formats: frozenset[str] | None = None
    # of those, the formats for which `auto` may take it (None: all it serves); an explicit choice
    # still serves every one of linear_formats (a baseline kept for ablations, not the fast path)
    auto_linear_formats: frozenset[str] | None = None
    # a check of this machine (e.g. an sm90 GPU and a Triton that compiles the kernel): None if it
    # can run, else why not
    available: Callable[[], str | None] | None = None

    def refusal(self, context: KernelContext, op: str | None = None) -> str | None:
        """Why this implementation (of `op`) cannot serve `context`, or None if it can."""
        checks = [
            ("platform", context.platform, self.platforms),
            ("dtype", context.dtype, self.dtypes),
            ("KV cache dtype", context.kv_dtype, self.kv_dtypes),
            ("head size", context.head_size, self.head_sizes),
        ]
        for what, value, allowed in checks:
            if value is not None and allowed is not None and value not in allowed:
                return f"{what} {value} is not among {sorted(map(str, allowed))}"
        missing_features = sorted(context.features_of(op) - self.features)
        if missing_features:
            return f"feature(s) {missing_features} are not among {sorted(self.features)}"
        if context.linear_formats and self.linear_formats is not None:
            missing = sorted(context.linear_formats - self.linear_formats)
            if missing:
                return f"quantized format(s) {missing} are not among {sorted(self.linear_formats)}"
        return self.available() if self.available is not None else None


@dataclass(frozen=True)
class KernelContext:
    """What a model needs of its kernels (None: not constrained)."""

    platform: str | None = None
    dtype: torch.dtype | None = None
    kv_dtype: torch.dtype | None = None
    head_size: int | None = None
    linear_formats: frozenset[str] = frozenset()  # the model's quantized layers' formats (quant_formats.py)
    # per op, the features the model's layers use (e.g. attention's "sliding_window", "sinks",
    # "softcap"): an implementation of that op must declare each of them (Supports.features)
    features: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def features_of(self, op: str | None) -> frozenset[str]:
        return frozenset(self.features.get(op, ())) if op is not None else frozenset()


@dataclass
class Implementation:
    op: str
    name: str
    supports: Supports
    priority: int  # "auto" takes the highest that supports the context
    entries: dict[str, Callable] = field(default_factory=dict)
    declared: bool = False  # supports given explicitly (by one of the entry points)

    @property
    def complete(self) -> bool:
        return set(OPS[self.op]) - OPTIONAL_ENTRIES.get(self.op, frozenset()) <= set(self.entries)


_REGISTRY: dict[str, dict[str, Implementation]] = {op: {} for op in OPS}


def register(
    op: str, name: str, *, entry: str | None = None, supports: Supports | None = None, priority: int | None = None
) -> Callable[[Callable], Callable]:
    """Register the decorated function as entry point `entry` (default: its name) of implementation
    `name` of `op`. `supports` and `priority` may be given on any of its entry points (once is
    enough; where given twice they must agree)."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops: {sorted(OPS)}")

    def decorate(fn: Callable) -> Callable:
        key = entry or fn.__name__
        if key not in OPS[op]:
            raise ValueError(f"{op}: entry point {key!r} is not one of {OPS[op]}")
        impl = _REGISTRY[op].setdefault(name, Implementation(op, name, Supports(), 0))
        if supports is not None:
            if impl.declared and supports != impl.supports:
                raise ValueError(f"{op}/{name}: entry points declare different supports")
            impl.supports, impl.declared = supports, True
        if priority is not None:
            impl.priority = priority
        if key in impl.entries and impl.entries[key] is not fn:
            raise ValueError(f"{op}/{name}: entry point {key!r} registered twice")
        impl.entries[key] = fn
        return fn

    return decorate


@functools.cache
def _load_all() -> None:
    """Import every module of tritonllm.kernels once, so that each registers its implementations."""
    package = importlib.import_module("tritonllm.kernels")
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"tritonllm.kernels.{module.name}")


def implementations(op: str) -> list[Implementation]:
    """The complete implementations of `op`, highest priority first."""
    _load_all()
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops: {sorted(OPS)}")
    return sorted((i for i in _REGISTRY[op].values() if i.complete), key=lambda i: -i.priority)


def _choose(op: str, choice: str, context: KernelContext) -> Implementation:
    impls = implementations(op)
    names = [i.name for i in impls]
    if choice == "auto":
        for impl in impls:
            auto_formats = impl.supports.auto_linear_formats
            if auto_formats is not None and not context.linear_formats <= auto_formats:
                continue
            if impl.supports.refusal(context, op) is None:
                return impl
        reasons = "; ".join(f"{i.name}: {i.supports.refusal(context, op)}" for i in impls)
        raise ValueError(f"kernels.{op}=auto: no implementation supports {context} ({reasons})")
    impl = next((i for i in impls if i.name == choice), None)
    if impl is None:
        raise ValueError(f"kernels.{op}={choice!r} is not registered; available: {['auto', *names]}")
    why = impl.supports.refusal(context, op)
    if why is not None:
        usable = [i.name for i in impls if i.supports.refusal(context, op) is None]
        raise ValueError(f"kernels.{op}={choice!r} cannot run here: {why}; usable here: {['auto', *usable]}")
    return impl


def _not_fused(*_args: object, **_kwargs: object) -> None:
    """An optional entry point (OPTIONAL_ENTRIES) that the chosen implementation leaves out."""
    return None


class Kernels:
    """One engine's chosen implementations: each entry point as an attribute
    (`kernels.rms_norm(x, w, eps)`), and `choice` (op -> implementation name)."""

    def __init__(self, chosen: Mapping[str, Implementation]) -> None:
        self.choice: dict[str, str] = {op: impl.name for op, impl in chosen.items()}
        self._capturable = {op: impl.supports.graphs for op, impl in chosen.items()}
        # plain attributes: a layer's call is an ordinary attribute lookup, on the hot path
        for op, impl in chosen.items():
            self.__dict__.update(dict.fromkeys(OPTIONAL_ENTRIES.get(op, ()), _not_fused), **impl.entries)

    def uncapturable(self, ops: Iterable[str]) -> list[str]:
        """Of `ops`, those whose chosen implementation cannot be captured into a CUDA/HIP graph."""
        return [op for op in ops if not self._capturable.get(op, True)]

    def __getattr__(self, entry: str) -> Callable:
        """Only reached for a name that is no entry point."""
        raise AttributeError(f"no kernel entry point {entry!r}; entry points: {sorted(ENTRY_OPS)}")

    def __repr__(self) -> str:
        return f"Kernels({self.choice})"


def select_kernels(
    choices: Mapping[str, str] | None = None, context: KernelContext | None = None, default: str = "auto"
) -> Kernels:
    """Per op, the implementation named in `choices` (or `default` for ops it leaves out; "auto":
    the best that supports `context`)."""
    choices = dict(choices or {})
    unknown = set(choices) - set(OPS)
    if unknown:
        raise ValueError(f"unknown kernel op(s) {sorted(unknown)}; ops: {sorted(OPS)}")
    context = context or KernelContext()
    return Kernels({op: _choose(op, choices.get(op, default), context) for op in OPS})


@functools.cache
def default_kernels() -> Kernels:
    """The "auto" choice on this platform, for layers used outside an engine (an engine binds its own)."""
    from tritonllm import platform

    return select_kernels(context=KernelContext(platform=platform.PLATFORM))


def bind_kernels(model: nn.Module, kernels: Kernels) -> None:
    """Give every layer of `model` that calls kernels (has a `kernels` attribute) this selection."""
    for module in model.modules():
        if hasattr(module, "kernels"):
            module.kernels = kernels


def describe(ops: Iterable[str] | None = None) -> str:
    """A table of the registered implementations (for `--help`-like listings and errors)."""
    lines = []
    for op in ops or OPS:
        for impl in implementations(op):
            s = impl.supports
            dtypes = "any" if s.dtypes is None else ",".join(sorted(str(d).removeprefix("torch.") for d in s.dtypes))
            formats = (
                "" if s.linear_formats is None or op != "linear" else f"  formats {','.join(sorted(s.linear_formats))}"
            )
            lines.append(f"{op:10s} {impl.name:16s} priority {impl.priority:3d}  dtypes {dtypes}  "
                         f"platforms {','.join(sorted(s.platforms))}  {','.join(sorted(s.features))}{formats}")  # fmt: skip
    return "\n".join(lines)
