"""The op catalogue: every hot op by name, served by the selected backend.

`triton` (default) runs the Triton kernels of this package; `torch_ref` runs the torch references
in `reference.py` (same signatures) for ablations and debugging. The backend is a config choice
(`kernels.backend`), applied once at engine start; there is no silent fallback between them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from tritonllm import platform  # noqa: F401  (switches on the interpreter on CPU before triton loads)

# op name -> module of kernels/ that defines the Triton launcher of the same name
_TRITON_MODULES: dict[str, str] = {
    "rms_norm": "rmsnorm",
    "fused_add_rms_norm": "rmsnorm",
    "rotary_embedding": "rotary",
    "silu_and_mul": "activation",
    "write_kv_cache": "kv_cache_write",
    "paged_attention": "attention",
    "plan_attention": "attention",
    "log_softmax": "sampling",
    "sample": "sampling",
}

BACKENDS = ("triton", "torch_ref")
_backend = "triton"
_table: dict[str, Callable] = {}


def set_backend(name: str) -> None:
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"kernels.backend={name!r} is not one of {BACKENDS}")
    _backend = name
    _table.clear()


def get_backend() -> str:
    return _backend


def _resolve(op: str) -> Callable:
    fn = _table.get(op)
    if fn is None:
        if _backend == "torch_ref":
            module = importlib.import_module("tritonllm.kernels.reference")
        else:
            module = importlib.import_module(f"tritonllm.kernels.{_TRITON_MODULES[op]}")
        fn = _table[op] = getattr(module, op)
    return fn


def __getattr__(op: str) -> Callable:
    if op in _TRITON_MODULES:
        return _resolve(op)
    raise AttributeError(op)
