"""Timing a layer's GEMM with its weight cold in L2, as a model's forward pass reads it.

A benchmark that calls one GEMM over and over on the same weight reads that weight from L2 from the
second call on wherever it fits (the H200's L2 holds 50 MB: a Llama-3-8B qkv or o projection in int4 or
FP8, most of one in bf16), while in a model every layer's weight is read once per step, from HBM. So the
benchmarks here rotate each timed call through copies of its weight whose bytes add up to several
times the L2: consecutive calls never find their weight there. The activations stay the same tensor
(in a model the previous kernel has just written them: warm).

    fn = rotate(lambda w: (lambda: gemm(x, w)), copies(weight))   # then time fn as before
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import torch

L2_MULTIPLE = 4  # the copies' bytes: at least this many L2s


def nbytes(obj) -> int:
    """Bytes of the tensors in obj (a tensor, or a dataclass of tensors)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if dataclasses.is_dataclass(obj):
        return sum(nbytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return 0


def clone(obj):
    """A copy of obj with every tensor in new memory (a tensor, or a dataclass of tensors)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(obj, **{f.name: clone(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
    return obj


def copies_needed(weight_bytes: int, l2_bytes: int | None = None) -> int:
    """How many copies of a weight of weight_bytes cover L2_MULTIPLE L2s (the first is the weight itself)."""
    if l2_bytes is None:
        l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return max(1, -(-L2_MULTIPLE * l2_bytes // max(1, weight_bytes)))


def copies(weight, cold: bool = True, l2_bytes: int | None = None) -> list:
    """`weight` and, when cold, clones of it: enough copies to cover L2_MULTIPLE L2s."""
    count = copies_needed(nbytes(weight), l2_bytes) if cold else 1
    return [weight] + [clone(weight) for _ in range(count - 1)]


def rotate(make: Callable[[object], Callable[[], object]], weights: list) -> Callable[[], object]:
    """A callable that runs make(w)() for the next of `weights` on each call. Each one's call runs once
    here, so that a graph capture of the callable finds everything built (compiles, lazily built state)."""
    calls = [make(w) for w in weights]
    for call in calls:
        call()
    cycle = itertools.cycle(calls)
    return lambda: next(cycle)()
