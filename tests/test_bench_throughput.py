"""scripts/bench_throughput.py: vLLM's flags in, throughput, latencies and memory out (tiny model)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_throughput.py"
_spec = importlib.util.spec_from_file_location("bench_throughput", _SCRIPT)
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench
_spec.loader.exec_module(bench)


def test_range_ratio_follows_vllm():
    assert bench.length_range(100, 0.0) == (100, 100)
    assert bench.length_range(562, 0.82) == (101, 1023)
    with pytest.raises(ValueError, match="random-range-ratio"):
        bench.length_range(100, 1.0)


def test_bench_throughput_reports_tokens_latencies_and_memory(tiny_llama, tmp_path):
    out = tmp_path / "bench.json"
    results = bench.main([
        "--model", tiny_llama, "--num-prompts", "3", "--input-len", "12", "--output-len", "4",
        "--random-range-ratio", "0.5", "--temperature", "0.6", "--max-model-len", "64", "--passes", "2",
        "--output-json", str(out),
    ])  # fmt: skip
    assert results["num_requests"] == 3 and results["detokenize"] is True and results["temperature"] == 0.6
    assert 3 * 2 <= results["output_tokens"] <= 3 * 6
    assert results["output_tok_per_s"] > 0 and results["total_tok_per_s"] > results["output_tok_per_s"]
    for name in ("ttft", "tpot"):
        assert 0 < results[f"{name}_p50_ms"] <= results[f"{name}_p99_ms"]
    assert results["peak_memory_gib"] > 0 and len(results["passes"]) == 2
    # each pass's GC counters (engine/host_gc.py); no device allocator on the CPU
    assert all(p["gc_full_collections"] >= 0 and p["gc_pause_s"] >= 0 for p in results["passes"])
    assert "device_malloc_calls" not in results
    assert json.loads(out.read_text())["results"]["output_tokens"] == results["output_tokens"]
