"""Speedup over bf16 cuBLAS against M of int4 (g128) W4A16 on the H200, Llama-3-8B layer shapes: the
Hopper Gluon kernels (GEMV at M = 1, tensor-core GEMM at M = 2..64, default plans) beside the portable
Triton kernels, from the sweeps of experiments/quant4/gemm_sm90/sweep.py:

    python experiments/quant4/gemm_sm90/plot.py OUT.png SWEEP.json [SWEEP.json ...]   (later files win)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LAYERS = ["qkv", "o", "gate_up", "down"]


def main() -> None:
    out, sweeps = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
    gluon, portable = {}, {}
    for sweep in sweeps:
        for r in json.loads(sweep.read_text()):
            if r["plan"] in ("auto", "gemv"):
                gluon[r["layer"], r["m"]] = r["speedup_vs_bf16"]
                portable[r["layer"], r["m"]] = r["bf16_us"] / r["portable_us"]
    fig, axes = plt.subplots(1, len(LAYERS), figsize=(18, 4.2), sharey=True)
    for ax, layer in zip(axes, LAYERS):
        for label, points, style in (("Gluon (sm90)", gluon, "o-"), ("portable Triton", portable, "s--")):
            ms = sorted(m for (lay, m) in points if lay == layer)
            ax.plot(ms, [points[layer, m] for m in ms], style, label=label)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.axhline(2.0, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_title(layer)
        ax.set_xlabel("M (tokens)")
    axes[0].set_ylabel("speedup over bf16 cuBLAS")
    axes[0].legend()
    fig.suptitle("int4 g128 W4A16 on the H200 (Llama-3-8B layer shapes)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
