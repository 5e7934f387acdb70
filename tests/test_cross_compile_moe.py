"""The fused-MoE kernels build for sm90 without a GPU (scripts/cross_compile_moe.py, a subprocess: this
one runs the interpreter): every kind's default tiles at every rows-per-expert bucket and both launches
without register spills, every variant (JOINT, SLOTS, TMA_B, SORTED_A) without a build error. A spill
slows a layer where no CPU test can see it: the FP8 block default at large batches (128 x 128 x 64,
eight warps) spilled, which this check now rules out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_moe_kernels_build_for_sm90_without_spills_by_default() -> None:
    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, "scripts/cross_compile_moe.py"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.rstrip().endswith(("ok", "spills"))]
    assert len(lines) >= 50 and "0 builds fail or spill by default" in result.stdout
    for kind in ("bfloat16", "fp8_block", "mxfp4"):  # each kind's GEMV and grouped builds, with variants
        assert any(line.startswith(kind) and "slots=8" in line for line in lines)
    assert any("tma_b=True,sorted_a=True" in line for line in lines)
    assert sum(line.startswith("router E=") for line in lines) == 3  # the fused router at three models' shapes
    assert sum(line.startswith("router+norm E=") for line in lines) == 2  # and with the norm folded in
