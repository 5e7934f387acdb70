"""TTFT, TPOT and inter-token latency (p50, p99) against request rate, from scripts/bench_serving.py's
JSONs (`bash scripts/gpu_check.sh bench-serving` writes serving_rate_<rate>.json), and the highest
rate whose TTFT p99 stays under 1 s:

    python experiments/serving/plot.py DIR [out.png]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent
TTFT_P99_LIMIT_MS = 1000.0


def load(folder: Path) -> list[dict]:
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("serving_rate_*.json"))]
    return sorted((r for r in runs if r["request_rate"] != float("inf")), key=lambda r: r["request_rate"])


def highest_rate_within_ttft(runs: list[dict], limit_ms: float = TTFT_P99_LIMIT_MS) -> float | None:
    """The highest measured rate whose TTFT p99 is under `limit_ms` (every lower rate too)."""
    best = None
    for r in runs:
        if r["ttft_ms"]["p99"] >= limit_ms or r["failed"]:
            break
        best = r["request_rate"]
    return best


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    runs = load(folder)
    rates = [r["request_rate"] for r in runs]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, title in zip(axes, ("ttft_ms", "tpot_ms", "itl_ms"), ("TTFT", "TPOT", "inter-token latency")):
        for stat, style in (("median", "-o"), ("p99", "--s")):
            ax.plot(rates, [r[key][stat] for r in runs], style, ms=4, label=stat)
        ax.set_title(f"{title} (ms)")
        ax.set_xlabel("request rate (req/s, Poisson)")
        ax.set_yscale("log")
        ax.legend()
    axes[0].axhline(TTFT_P99_LIMIT_MS, color="gray", lw=0.8)
    limit = highest_rate_within_ttft(runs)
    first = runs[0] if runs else {}
    fig.suptitle(
        f"{first.get('model', '')}: {first.get('num_prompts', '')} requests per rate; highest rate with TTFT p99 < 1 s: {limit}"
    )
    fig.tight_layout()
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else folder / "latency_vs_rate.png"
    fig.savefig(out, dpi=120)
    print(f"wrote {out}; highest rate with TTFT p99 under 1 s: {limit}")


if __name__ == "__main__":
    main()
