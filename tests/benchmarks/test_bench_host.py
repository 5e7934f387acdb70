"""The host-overhead benchmark (CPU): the real engine loop around a stubbed device, microseconds
per decode step. In CI it runs once, small, as a check that the benchmark works; run it in full
with `python scripts/bench_host_overhead.py` (256 running requests)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_host_overhead.py"
_spec = importlib.util.spec_from_file_location("bench_host_overhead", _SCRIPT)
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench
_spec.loader.exec_module(bench)


def test_bench_host_overhead_per_decode_step(benchmark) -> None:
    llm = bench.build(num_requests=16, max_model_len=256, vocab_size=3000)
    results = benchmark.pedantic(
        lambda: [bench.measure(llm, 16, 8, streaming, prompt_len=20) for streaming in (False, True)], rounds=1
    )
    for result in results:
        assert result["num_running"] == 16 and result["us_per_step"] > 0
        assert result["schedule_us"] + result["execute_us"] + result["process_us"] <= result["us_per_step"]
    engine = llm.llm_engine
    engine.kv_cache.check_invariant()
    assert not engine.has_unfinished_requests() and engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks
    benchmark.extra_info["results"] = results
