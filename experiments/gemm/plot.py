"""Speedup over bf16 cuBLAS against M, per format, of the Triton GEMMs (and torch's own FP8/INT8
GEMMs) at the Llama-3-8B layer shapes: python experiments/gemm/plot.py [gemm_h200.json] [out.png]"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent


def main() -> None:
    data = json.loads(Path(sys.argv[1] if len(sys.argv) > 1 else HERE / "gemm_h200.json").read_text())
    impls = {"triton_gemm": "triton", "torch_gemm": "torch", "triton_block_sm90": "gluon sm90"}
    rows = [r for r in data["rows"] if r["model"] == "llama3-8b" and r["impl"] in impls]
    layers = sorted({r["layer"] for r in rows}, key=["qkv", "o", "gate_up", "down"].index)
    fig, axes = plt.subplots(1, len(layers), figsize=(5 * len(layers), 4.5), sharey=True)
    for ax, layer in zip(axes, layers):
        series = defaultdict(list)
        for r in rows:
            if r["layer"] == layer:
                series[f"{r['format']} ({impls[r['impl']]})"].append(
                    (r["m"], r["speedup_vs_bf16_cublas"])
                )
        for label, points in sorted(series.items()):
            points.sort()
            style = "--" if "torch" in label else "-"
            ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", ms=3, label=label)
        n, k = next((r["n"], r["k"]) for r in rows if r["layer"] == layer)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{layer}: N={n}, K={k}")
        ax.set_xlabel("M (tokens)")
    axes[0].set_ylabel("speedup over bf16 cuBLAS (torch.matmul)")
    axes[-1].legend(fontsize=7)
    fig.suptitle(
        f"Llama-3-8B layer GEMMs on the {data['device']} (triton {data['triton']}, torch {data['torch']}); GPU time, each call replayed from a CUDA graph"
    )
    fig.tight_layout()
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "speedup_vs_m_h200.png"
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
