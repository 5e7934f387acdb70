"""GET /metrics: `engine.get_metrics()` in Prometheus' text format, through `prometheus-client`.

Each scrape turns the engine's snapshot into metric families (vLLM's names with the `tritonllm:`
prefix, a `model_name` label): counters get Prometheus' `_total` suffix (`tritonllm:prompt_tokens_total`,
as vLLM's `vllm:prompt_tokens_total`); histograms keep the engine's bounded buckets (vLLM's edges,
metrics/stats.py), so memory does not grow with the number of requests served.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import accumulate

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from tritonllm.metrics.stats import Counter, Gauge, Histogram

CONTENT_TYPE = CONTENT_TYPE_LATEST


class _Snapshot:
    """A one-scrape collector over an engine metrics snapshot."""

    def __init__(self, metrics: Sequence[Gauge | Counter | Histogram], model_name: str) -> None:
        self.metrics, self.model_name = metrics, model_name

    def collect(self) -> Iterator[Metric]:
        labels, values = ["model_name"], [self.model_name]
        for m in self.metrics:
            if isinstance(m, Histogram):
                family = HistogramMetricFamily(m.name, m.name, labels=labels)
                cumulative = list(accumulate(m.counts))
                buckets = [(str(le), c) for le, c in zip(m.buckets, cumulative)] + [("+Inf", m.count)]
                family.add_metric(values, buckets, m.sum)
            elif isinstance(m, Counter):
                family = CounterMetricFamily(m.name, m.name, labels=labels)
                family.add_metric(values, m.value)
            else:
                family = GaugeMetricFamily(m.name, m.name, labels=labels)
                family.add_metric(values, m.value)
            yield family


def prometheus_text(metrics: Sequence[Gauge | Counter | Histogram], model_name: str) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(metrics, model_name))
    return generate_latest(registry)
