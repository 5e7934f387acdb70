"""scripts/bench_serving.py against a live server on the tiny model: every request completes with
its requested output length, the latency statistics are filled, and refused requests are counted."""

import importlib.util
import sys
from pathlib import Path

import pytest
from live_server import live_server  # this folder (pytest puts it on sys.path)

from tritonllm import LLM
from tritonllm.engine.async_engine import AsyncLLMEngine
from tritonllm.entrypoints.openai.app import build_app
from tritonllm.entrypoints.openai.limits import ServerLimits

# the server's behaviour, not its kernels, is under test: the torch reference kernels run natively on
# the CPU (the Triton ones in the interpreter: ~30x slower at 200 concurrent requests)
REF = "torch_ref"

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_serving.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("bench_serving", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_serving"] = module  # (dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def server(tiny_llama):
    engine = AsyncLLMEngine(LLM(model=tiny_llama, max_model_len=128, seed=0, kernel_backend=REF).llm_engine)
    with live_server(build_app(engine, "tiny", ServerLimits(api_key="k"))) as url:
        yield url
    engine.shutdown()


def test_bench_serving_reports_every_request(server, tmp_path):
    bench = _load_script()
    out = tmp_path / "serving.json"
    args = ["--base-url", server, "--model", "tiny", "--num-prompts", "8", "--random-input-len", "12",
            "--random-output-len", "5", "--random-range-ratio", "0.5", "--request-rate", "40", "--max-concurrency", "4",
            "--token-id-max", "300", "--api-key", "k", "--save-result", str(out), "--save-detailed"]  # fmt: skip
    summary = bench.main(args)
    assert summary["completed"] == 8 and summary["failed"] == 0, summary["errors"]
    assert summary["total_output_tokens"] == sum(r["output_tokens"] for r in summary["requests"])
    assert all(r["output_tokens"] == r["requested_tokens"] for r in summary["requests"])
    assert {r["requested_tokens"] for r in summary["requests"]} <= {2, 3, 4, 5}
    assert all(r["ttft_s"] > 0 and r["latency_s"] >= r["ttft_s"] for r in summary["requests"])
    assert summary["ttft_ms"]["p99"] >= summary["ttft_ms"]["median"] > 0 and summary["itl_ms"]["mean"] > 0
    assert summary["device_malloc_calls"] is None  # a CPU server exports no device allocator metrics
    assert summary["gc_full_collections"] >= 0 and summary["gc_pause_s"] >= 0  # the server's GC, on every device
    assert out.exists()


def test_the_device_allocation_count_is_read_from_the_metrics_exposition():
    """The CUDA allocator's counters as the engine reports them (a fake CUDA device's stats), through
    the server's Prometheus text, back into bench_serving's delta."""
    from types import SimpleNamespace

    from tritonllm.entrypoints.openai.metrics import prometheus_text
    from tritonllm.metrics.stats import device_memory_metrics

    stats = {"num_device_alloc": 17, "reserved_bytes.all.current": 3 << 30, "allocated_bytes.all.current": 1 << 30}
    metrics = device_memory_metrics(SimpleNamespace(type="cuda"), memory_stats=lambda device: stats)
    assert {m.name: m.value for m in metrics}["tritonllm:device_malloc_calls"] == 17
    assert device_memory_metrics(SimpleNamespace(type="cpu")) == []
    text = prometheus_text(metrics, "tiny").decode()
    assert "tritonllm:device_memory_reserved_bytes" in text
    bench = _load_script()
    assert bench.run_counters_in(text)["device_malloc_calls"] == 17
    assert bench.run_counters_in(prometheus_text([], "tiny").decode())["device_malloc_calls"] is None


def test_gc_counters_are_read_from_the_metrics_exposition():
    """GcPauses' counters through the server's Prometheus text into bench_serving's growth over a run:
    a full collection made between two scrapes shows up as one more, with its time."""
    import gc

    from tritonllm.engine.host_gc import GcPauses
    from tritonllm.entrypoints.openai.metrics import prometheus_text
    from tritonllm.metrics.stats import counter_growth

    bench = _load_script()
    pauses = GcPauses.install()
    before = bench.run_counters_in(prometheus_text(pauses.metrics(), "tiny").decode())
    gc.collect()
    after = bench.run_counters_in(prometheus_text(pauses.metrics(), "tiny").decode())
    growth = counter_growth(before, after)
    assert growth["gc_full_collections"] >= 1 and growth["gc_pause_s"] > 0
    assert growth["device_malloc_calls"] is None


def test_bench_serving_counts_refused_requests(server):
    summary = _load_script().main(["--base-url", server, "--model", "tiny", "--num-prompts", "3", "--random-input-len",
                                   "4", "--random-output-len", "2", "--token-id-max", "300", "--api-key", "wrong",
                                   "--no-warmup"])  # fmt: skip
    assert summary["completed"] == 0 and summary["failed"] == 3
    assert any("HTTP 401" in e for e in summary["errors"])


def test_a_repeated_seed_is_reported_as_prefix_cache_hits(server):
    """The same prompts sent again are served from the prefix cache (earlier sessions' repeated runs at
    one rate were, unnoticed); the result says so, and a new seed's prompts are prefilled afresh."""
    bench = _load_script()

    def run(seed: int) -> dict:
        return bench.main(["--base-url", server, "--model", "tiny", "--num-prompts", "4", "--random-input-len", "40",
                           "--random-output-len", "2", "--token-id-max", "300", "--api-key", "k",
                           "--seed", str(seed)])  # fmt: skip

    first, again, other = run(101), run(101), run(102)
    assert all(s["completed"] == 4 and s["prefix_cache_queries"] == 4 * 40 for s in (first, again, other))
    assert first["prefix_cache_hit_rate"] < 0.1 and other["prefix_cache_hit_rate"] < 0.1
    assert again["prefix_cache_hit_rate"] >= 0.5  # every full block of each 40-token prompt
