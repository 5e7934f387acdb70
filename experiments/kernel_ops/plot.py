"""Per-op kernel benchmark on the H200 (tests/benchmarks/test_bench_ops.py): achieved TB/s of every
registered implementation, from ops_h200.json beside this script.

    python experiments/kernel_ops/plot.py   # writes ops_h200.png
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent


def main() -> None:
    rows = json.loads((HERE / "ops_h200.json").read_text())["benchmarks"]
    names = [r["name"].removeprefix("test_bench_op[").removesuffix("]") for r in rows]
    rates = [r["extra_info"]["tb_per_s"] for r in rows]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    colors = ["tab:gray" if n.endswith("torch_ref") else "tab:blue" for n in names]
    ax.bar(range(len(names)), rates, color=colors)
    for i, (rate, row) in enumerate(zip(rates, rows)):
        ax.text(i, rate + 0.05, f"{rate:.2f}\n{row['extra_info']['us']:.0f} us", ha="center", fontsize=7)
    ax.axhline(4.8, color="gray", linestyle="--", linewidth=1, label="H200 HBM3e peak 4.8 TB/s")
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("achieved TB/s")
    ax.set_title("Kernel registry: every implementation of each op, H200, bf16 (blue: Triton, gray: torch reference)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "ops_h200.png", dpi=120)


if __name__ == "__main__":
    main()
