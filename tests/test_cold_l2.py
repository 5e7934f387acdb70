"""scripts/cold_l2.py: the GEMM benchmarks' timed calls rotate through copies of the weight that cover
several L2s, so that no call finds its weight in L2 (as a model's step reads each layer's once)."""

from __future__ import annotations

import torch

from scripts import cold_l2
from tritonllm.kernels.quant_formats import INT4, QuantScheme
from tritonllm.quantization.quantize import quantize_weight


def _weight():
    return quantize_weight(torch.randn(48, 256), QuantScheme(INT4, "group", "none", group_size=128))


def test_copies_cover_the_l2_multiple() -> None:
    assert cold_l2.copies_needed(10, l2_bytes=100) == 4 * 100 // 10
    assert cold_l2.copies_needed(1000, l2_bytes=100) == 1  # one copy is already 10 L2s
    assert cold_l2.copies_needed(399, l2_bytes=100) == 2  # rounded up


def test_a_quantized_weight_is_cloned_tensor_by_tensor() -> None:
    q = _weight()
    c = cold_l2.clone(q)
    assert cold_l2.nbytes(c) == cold_l2.nbytes(q) == 48 * 128 + 2 * 2 * 48 * 2  # words + scales + zero points
    for name in ("data", "scale", "zeros"):
        a, b = getattr(q, name), getattr(c, name)
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr(), name
    assert c.scheme == q.scheme


def test_consecutive_calls_read_different_copies_and_each_copy_ran_once_up_front() -> None:
    q = _weight()
    l2 = 3 * cold_l2.nbytes(q)  # 4 L2s: 12 copies
    seen: list[int] = []
    fn = cold_l2.rotate(lambda w: lambda: seen.append(w.data.data_ptr()), cold_l2.copies(q, cold=True, l2_bytes=l2))
    warmup, seen[:] = list(seen), []
    assert len(warmup) == len(set(warmup)) == 12 and warmup[0] == q.data.data_ptr()
    for _ in range(24):
        fn()
    assert seen == warmup + warmup  # the cycle: each copy once before any repeats


def test_warm_mode_times_the_weight_itself() -> None:
    q = _weight()
    seen: list[int] = []
    fn = cold_l2.rotate(lambda w: lambda: seen.append(w.data.data_ptr()), cold_l2.copies(q, cold=False, l2_bytes=1))
    for _ in range(3):
        fn()
    assert set(seen) == {q.data.data_ptr()}
