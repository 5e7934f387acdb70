"""Paged-attention kernel benchmarks (GPU only): the cases of scripts/bench_attention.py.

Each case is first checked against the float32 torch reference. pytest-benchmark's own statistics
time rounds of back-to-back calls with a clock that waits for the GPU (so they are GPU time per
call, L2 warm); extra_info holds the figures to report: triton.testing.do_bench medians (L2
flushed) of the kernel and of torch SDPA on contiguous K/V, TB/s or TFLOP/s, and the ratio.

    python -m pytest -m gpu -o addopts="" tests/benchmarks --benchmark-json=$OUT/attention.json
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_attention.py"
_spec = importlib.util.spec_from_file_location("bench_attention", _SCRIPT)
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # its dataclasses look their module up there
_spec.loader.exec_module(bench)


@pytest.mark.gpu
@pytest.mark.benchmark(group="paged_attention", timer=bench.synchronized_clock, disable_gc=True)
@pytest.mark.parametrize("case", bench.CASES, ids=lambda case: case.name)
def test_bench_paged_attention(benchmark, case) -> None:
    inputs = bench.build_inputs(case, "cuda", torch.bfloat16)
    error, ok = bench.max_error(inputs.run(), bench.reference_output(inputs))
    assert ok, f"{case.name}: max abs error {error} against the float32 reference"
    benchmark.extra_info.update(bench.measure(inputs), max_abs_error=error)
    benchmark.pedantic(inputs.run, rounds=20, iterations=10, warmup_rounds=2)
