"""The host-loop ablations on the H200 (nano-vllm's benchmark, Qwen3-0.6B): output tok/s per variant,
first and second timed pass, from the JSON files beside this script (sessions 1-3) and in session4/.

    python experiments/host_loop/plot.py   # writes ablation_h200.png and ablation_session4_h200.png
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent
SESSION4 = [
    ("nopiecewise", "piecewise graphs off\nT=0.6, text"),
    ("overlap", "piecewise graphs on\nT=0.6, text\n(nano-vllm's settings)"),
    ("topk_topp", "piecewise graphs on\nT=0.6, top-k 50, top-p 0.95\ntext"),
    ("greedy", "piecewise graphs on\ngreedy, text"),
]
VARIANTS = [
    ("sync", "overlap off\nT=0.6, text"),
    ("overlap", "overlap on\nT=0.6, text\n(nano-vllm's settings)"),
    ("topk_topp", "overlap on\nT=0.6, top-k 50, top-p 0.95\ntext"),
    ("greedy", "overlap on\ngreedy, text"),
    ("greedy_nodetok", "overlap on\ngreedy, no text"),
]


def plot(folder: Path, variants: list[tuple[str, str]], title: str, out: Path) -> None:
    first, second = [], []
    for name, _ in variants:
        passes = json.loads((folder / f"qwen3-0.6b_nanovllm_{name}.json").read_text())["results"]["passes"]
        first.append(passes[0]["output_tok_per_s"])
        second.append(passes[1]["output_tok_per_s"])
    x = range(len(variants))
    fig, ax = plt.subplots(figsize=(10, 4.8))
    ax.bar([i - 0.2 for i in x], first, 0.4, label="first timed pass (the figure)")
    ax.bar([i + 0.2 for i in x], second, 0.4, label="second pass")
    for i, (a, b) in enumerate(zip(first, second)):
        ax.text(i - 0.2, a + 300, f"{a:,.0f}", ha="center", fontsize=8)
        ax.text(i + 0.2, b + 300, f"{b:,.0f}", ha="center", fontsize=8)
    ax.axhline(20000, color="gray", linestyle="--", linewidth=1, label="target 20,000")
    ax.set_xticks(list(x), [label for _, label in variants], fontsize=8)
    ax.set_ylabel("output tok/s")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    title = "nano-vllm benchmark, Qwen3-0.6B (random weights), H200"
    plot(HERE, VARIANTS, f"{title}: host-loop ablation", HERE / "ablation_h200.png")
    plot(HERE / "session4", SESSION4, f"{title}: piecewise graphs, candidate sampler",
         HERE / "ablation_session4_h200.png")  # fmt: skip


if __name__ == "__main__":
    main()
