"""GET /metrics: `engine.get_metrics()` in Prometheus' text format (0.0.4), vLLM-style.

Counters get Prometheus' `_total` suffix (`tritonllm:prompt_tokens_total`, as vLLM's
`vllm:prompt_tokens_total`); latency histograms are bucketed from the engine's raw values.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from tritonllm.metrics.stats import Counter, Gauge, Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
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


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(metrics: Sequence[Gauge | Counter | Histogram], model_name: str) -> str:
    labels = f'model_name="{_label_value(model_name)}"'
    lines = []
    for metric in metrics:
        if isinstance(metric, Histogram):
            values = sorted(metric.values)
            lines.append(f"# TYPE {metric.name} histogram")
            for bound in BUCKETS_S:
                lines.append(f'{metric.name}_bucket{{{labels},le="{bound}"}} {bisect.bisect_right(values, bound)}')
            lines.append(f'{metric.name}_bucket{{{labels},le="+Inf"}} {metric.count}')
            lines.append(f"{metric.name}_sum{{{labels}}} {metric.sum}")
            lines.append(f"{metric.name}_count{{{labels}}} {metric.count}")
        elif isinstance(metric, Counter):
            lines.append(f"# TYPE {metric.name}_total counter")
            lines.append(f"{metric.name}_total{{{labels}}} {metric.value}")
        else:
            lines.append(f"# TYPE {metric.name} gauge")
            lines.append(f"{metric.name}{{{labels}}} {metric.value}")
    return "\n".join(lines) + "\n"
