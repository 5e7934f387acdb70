"""Engine metrics with vLLM-style names, exposed by `LLM.get_metrics()` (and later Prometheus).

Per step: scheduled tokens, running, waiting, KV usage. Per request: queue time, TTFT, TPOT and
end-to-end latency, kept as histograms (count, sum, values).
"""

from __future__ import annotations

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
    value: int


@dataclass
class Histogram:
    name: str
    count: int
    sum: float
    values: list[float]

    @property
    def value(self) -> float:
        """The mean; the raw values are in `values`."""
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
    queue_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)

    def record_finished(
        self,
        arrival: float,
        scheduled: float | None,
        first_token: float | None,
        finished: float,
        num_output_tokens: int,
    ) -> None:
        self.num_finished += 1
        self.e2e_s.append(finished - arrival)
        if scheduled is not None:
            self.queue_s.append(scheduled - arrival)
        if first_token is not None:
            self.ttft_s.append(first_token - arrival)
            if num_output_tokens > 1:
                self.tpot_s.append((finished - first_token) / (num_output_tokens - 1))

    def snapshot(
        self,
        num_running: int,
        num_waiting: int,
        kv_usage: float,
        num_preemptions: int,
        prefix_cache_queries: int,
        prefix_cache_hits: int,
    ) -> list[Gauge | Counter | Histogram]:
        def hist(name: str, values: list[float]) -> Histogram:
            return Histogram(PREFIX + name, len(values), float(sum(values)), list(values))

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
            hist("request_queue_time_seconds", self.queue_s),
            hist("time_to_first_token_seconds", self.ttft_s),
            hist("time_per_output_token_seconds", self.tpot_s),
            hist("e2e_request_latency_seconds", self.e2e_s),
        ]
