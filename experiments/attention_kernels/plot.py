"""Paged attention on the H200 against torch SDPA (scripts/bench_attention.py): time per case and the
speed-up, from attention_h200.json beside this script.

    python experiments/attention_kernels/plot.py   # writes attention_h200.png
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent


def main() -> None:
    data = json.loads((HERE / "attention_h200.json").read_text())
    rows = [r for r in data["results"] if "us" in r]
    names = [r["case"] for r in rows]
    fig, ax = plt.subplots(figsize=(11, 4.8))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["us"] for r in rows], 0.4, label="tritonllm (Triton)")
    ax.bar([i + 0.2 for i in x], [r["sdpa_us"] for r in rows], 0.4, label="torch SDPA (contiguous K/V)")
    for i, r in enumerate(rows):
        ax.text(i, max(r["us"], r["sdpa_us"]) * 1.15, f"{r['speedup_vs_sdpa']:.2f}x", ha="center", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(list(x), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("us per layer (log)")
    ax.set_title(f"Paged attention vs SDPA, H200, bf16, {data['date']} (label: speed-up over SDPA)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "attention_h200.png", dpi=120)


if __name__ == "__main__":
    main()
