"""Speedup over bf16 cuBLAS against M of the skinny sm90 GEMM (best swept plan), the portable Triton
kernels and torch._scaled_mm, per Llama-3-8B layer, bf16 and FP8, from the sweeps' JSON:

    python experiments/gemm/skinny_sm90/plot.py h200_session14/skinny.json h200_session14/skinny_plans2.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    rows = [r for path in sys.argv[1:] for r in json.loads(Path(path).read_text())]
    best, portable, scaled = defaultdict(dict), defaultdict(dict), defaultdict(dict)
    for r in rows:
        key = (r["layer"], r["dtype"])
        best[key][r["m"]] = max(best[key].get(r["m"], 0.0), r["speedup_vs_bf16"])
        portable[key][r["m"]] = r["bf16_us"] / r["portable_us"]
        if r.get("torch_own_us"):
            scaled[key][r["m"]] = r["bf16_us"] / r["torch_own_us"]
    layers = sorted({layer for layer, _ in best}, key=["qkv", "o", "gate_up", "down"].index)
    fig, axes = plt.subplots(1, len(layers), figsize=(4 * len(layers), 3.6), sharey=True)
    for ax, layer in zip(axes, layers):
        for dtype, color in (("bf16", "tab:blue"), ("fp8", "tab:red")):
            for series, style, label in ((best, "-o", "skinny sm90"), (portable, "--x", "portable Triton")):
                pts = sorted(series[(layer, dtype)].items())
                if pts:
                    ax.plot(*zip(*pts), style, color=color, label=f"{dtype} {label}")
            pts = sorted(scaled[(layer, dtype)].items())
            if pts:
                ax.plot(*zip(*pts), ":s", color="tab:gray", label="fp8 torch._scaled_mm")
        ax.axhline(1.0, color="black", lw=0.5)
        ax.set_xscale("log", base=2)
        ax.set_title(layer)
        ax.set_xlabel("M (tokens)")
    axes[0].set_ylabel("speedup over bf16 cuBLAS")
    axes[-1].legend(fontsize=7)
    fig.suptitle("Skinny GEMMs on the H200 (CUDA-graph replay; skinny: best swept plan)")
    fig.tight_layout()
    out = Path(__file__).parent / "speedup_vs_m_h200.png"
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
