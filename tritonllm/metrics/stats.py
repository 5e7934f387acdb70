"""Engine metrics with vLLM-style names, exposed by `LLM.get_metrics()` (and later Prometheus).

Per step: scheduled tokens, running, waiting, KV usage. Per request: queue time, TTFT, TPOT and
end-to-end latency, kept as histograms with vLLM's bucket edges (count, sum, and a count per bucket:
bounded however long the server runs).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

PREFIX = "tritonllm:"


@dataclass
class Gauge:
    name: str
    value: float


@dataclass
class Counter:
    name: str
    value: int | float


# vLLM's bucket edges (upper bounds, seconds), so dashboards built for vLLM read ours
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
TPOT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


@dataclass
class Histogram:
    name: str
    buckets: tuple[float, ...]  # upper bounds (inclusive), increasing; +Inf is implied
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; the last one is +Inf
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def copy(self) -> Histogram:
        return Histogram(self.name, self.buckets, list(self.counts), self.sum, self.count)

    @property
    def value(self) -> float:
        """The mean."""
        return self.sum / self.count if self.count else 0.0


@dataclass
class StepStats:
    time_s: float  # time.monotonic() when the step was scheduled
    num_scheduled_seqs: int  # the batch size
    num_scheduled_tokens: int
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_preempted: int


@dataclass
class EngineStats:
    """Accumulated by the engine; read by `snapshot`, which also takes the counters that the
    scheduler (preemptions) and the KV cache manager (prefix-cache lookups) own."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_finished: int = 0
    steps: deque[StepStats] = field(default_factory=lambda: deque(maxlen=10000))
    queue_s: Histogram = field(
        default_factory=lambda: Histogram(PREFIX + "request_queue_time_seconds", LATENCY_BUCKETS)
    )
    ttft_s: Histogram = field(default_factory=lambda: Histogram(PREFIX + "time_to_first_token_seconds", TTFT_BUCKETS))
    tpot_s: Histogram = field(default_factory=lambda: Histogram(PREFIX + "time_per_output_token_seconds", TPOT_BUCKETS))
    e2e_s: Histogram = field(default_factory=lambda: Histogram(PREFIX + "e2e_request_latency_seconds", LATENCY_BUCKETS))

    def record_finished(
        self,
        arrival: float,
        scheduled: float | None,
        first_token: float | None,
        finished: float,
        num_output_tokens: int,
    ) -> None:
        self.num_finished += 1
        self.e2e_s.observe(finished - arrival)
        if scheduled is not None:
            self.queue_s.observe(scheduled - arrival)
        if first_token is not None:
            self.ttft_s.observe(first_token - arrival)
            if num_output_tokens > 1:
                self.tpot_s.observe((finished - first_token) / (num_output_tokens - 1))

    def snapshot(
        self,
        num_running: int,
        num_waiting: int,
        kv_usage: float,
        num_preemptions: int,
        prefix_cache_queries: int,
        prefix_cache_hits: int,
    ) -> list[Gauge | Counter | Histogram]:
        return [
            Gauge(PREFIX + "num_requests_running", num_running),
            Gauge(PREFIX + "num_requests_waiting", num_waiting),
            Gauge(PREFIX + "kv_cache_usage_perc", kv_usage),
            Counter(PREFIX + "num_preemptions", num_preemptions),
            Counter(PREFIX + "prompt_tokens", self.prompt_tokens),
            Counter(PREFIX + "generation_tokens", self.generation_tokens),
            Counter(PREFIX + "request_success", self.num_finished),
            Counter(PREFIX + "prefix_cache_queries", prefix_cache_queries),
            Counter(PREFIX + "prefix_cache_hits", prefix_cache_hits),
            self.queue_s.copy(),
            self.ttft_s.copy(),
            self.tpot_s.copy(),
            self.e2e_s.copy(),
        ]


def device_memory_metrics(device, memory_stats=None) -> list[Gauge | Counter]:
    """The CUDA caching allocator's state on `device` (nothing on other devices): the device
    allocations it has made (cudaMalloc / cuMemMap calls: a step that makes one waits for it, so a
    count that still grows under steady load says the pool is still filling) and the bytes it
    reserves and hands out. `memory_stats` stands in for torch.cuda.memory_stats (tests)."""
    if getattr(device, "type", None) != "cuda":
        return []
    if memory_stats is None:
        import torch

        memory_stats = torch.cuda.memory_stats
    stats = memory_stats(device)
    return [
        Counter(PREFIX + "device_malloc_calls", int(stats.get("num_device_alloc", 0))),
        Gauge(PREFIX + "device_memory_reserved_bytes", float(stats.get("reserved_bytes.all.current", 0))),
        Gauge(PREFIX + "device_memory_allocated_bytes", float(stats.get("allocated_bytes.all.current", 0))),
    ]


# Counters whose growth over a benchmark run is reported (workloads.py, scripts/bench_serving.py):
# device allocations (a pool still filling), Python's full collections and the time all its
# collections took (engine/host_gc.py), and the prompt tokens looked up in and found in the prefix
# cache (a benchmark that repeats its prompts measures cache hits, not prefills: prefix_cache_hit_rate).
# Each: the counter names (without PREFIX) it sums.
RUN_COUNTERS = {
    "device_malloc_calls": ("device_malloc_calls",),
    "gc_full_collections": ("gc_collections_gen2",),
    "gc_pause_s": ("gc_pause_seconds_gen0", "gc_pause_seconds_gen1", "gc_pause_seconds_gen2"),
    "prefix_cache_queries": ("prefix_cache_queries",),
    "prefix_cache_hits": ("prefix_cache_hits",),
}


def run_counters(values: dict[str, float]) -> dict[str, float | None]:
    """RUN_COUNTERS from counter values by name (without PREFIX); None where a counter is absent."""
    out: dict[str, float | None] = {}
    for key, names in RUN_COUNTERS.items():
        present = [values[name] for name in names if name in values]
        out[key] = sum(present) if present else None
    return out


def counter_growth(before: dict[str, float | None], after: dict[str, float | None]) -> dict[str, float | None]:
    """after - before per RUN_COUNTERS key (None where either is missing), and prefix_cache_hit_rate: the
    share of the run's looked-up prompt tokens found cached (None without lookups)."""
    growth = {k: None if before.get(k) is None or after.get(k) is None else after[k] - before[k] for k in RUN_COUNTERS}
    queries, hits = growth["prefix_cache_queries"], growth["prefix_cache_hits"]
    growth["prefix_cache_hit_rate"] = hits / queries if queries and hits is not None else None
    return growth
