"""Typed workload configs: each `workload.kind` is a dataclass, so a wrong key or a value of the
wrong type fails with a message that names what is allowed, before anything runs."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any


@dataclass
class DemoWorkload:
    kind: str
    prompts: list[str] = field(default_factory=list)
    max_tokens: int = 32
    temperature: float = 0.0
    ignore_eos: bool = False


@dataclass
class RandomWorkload:
    kind: str
    num_requests: int = 64
    prompt_len_min: int = 512
    prompt_len_max: int = 512
    output_len_min: int = 128
    output_len_max: int = 128
    token_id_max: int | None = None
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    detokenize: bool = False
    seed: int = 0
    warmup_prompt: str | None = None
    warmup_requests: int = 2
    passes: int = 1
    # > 1: each request draws a priority in [0, priority_levels) (lower is served first under
    # scheduler.policy=priority) and TTFT is also reported per level
    priority_levels: int = 1


@dataclass
class SharedPrefixWorkload:
    kind: str
    num_requests: int = 200
    prefix_len: int = 2000
    suffix_len: int = 100
    output_len: int = 128
    temperature: float = 0.0
    seed: int = 0


@dataclass
class KernelBenchWorkload:
    kind: str
    select: str | None = None
    tests: str = "tests/benchmarks"


@dataclass
class ServeWorkload:
    kind: str
    host: str = "0.0.0.0"
    port: int = 8000
    served_model_name: str | None = None  # None: the model path (the tiny model: "tiny-llama")
    log_level: str = "info"


WORKLOAD_TYPES: dict[str, type] = {
    "demo": DemoWorkload,
    "random": RandomWorkload,
    "shared_prefix": SharedPrefixWorkload,
    "kernel_bench": KernelBenchWorkload,
    "serve": ServeWorkload,
}


def _accepts(annotation: Any, value: Any) -> bool:
    if annotation is Any:
        return True
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return any(_accepts(a, value) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation)
    if origin is list:
        (item,) = typing.get_args(annotation)
        return isinstance(value, list) and all(_accepts(item, v) for v in value)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def parse_workload(values: dict[str, Any]) -> Any:
    """The workload dataclass of values["kind"], filled from `values`; ValueError on an unknown kind
    or key, or a value of the wrong type."""
    kind = values.get("kind")
    if kind not in WORKLOAD_TYPES:
        raise ValueError(f"workload.kind={kind!r} is not one of {sorted(WORKLOAD_TYPES)}")
    cls = WORKLOAD_TYPES[kind]
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"unknown workload option(s) {unknown} for kind {kind!r}; known: {known}")
    for name, value in values.items():
        if not _accepts(hints[name], value):
            expected = getattr(hints[name], "__name__", str(hints[name]))
            raise ValueError(f"workload.{name}={value!r} is not a {expected} (workload kind {kind!r})")
    return cls(**values)
