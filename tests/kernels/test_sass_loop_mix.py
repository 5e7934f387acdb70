"""scripts/sass_loop_mix.py: the 4-bit GEMV's inner loop in SASS for sm90, built without a GPU by
Triton's bundled ptxas (in a subprocess: this process runs Triton's interpreter)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("fp4", [False, True], ids=["int4", "mxfp4"])
def test_the_gemv_loop_is_counted(fp4: bool) -> None:
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="0")
    args = [sys.executable, "scripts/sass_loop_mix.py"] + (["--fp4"] if fp4 else [])
    result = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    per_weight = float(re.search(r"([0-9.]+) a weight", result.stdout).group(1))
    counts = dict(re.findall(r"^\s+([A-Z][A-Z0-9_]*)\s+(\d+)", result.stdout, re.M))
    # a weight costs at least its FMA and its decode; the loads are there; no spills
    assert per_weight > 2 and int(counts["FFMA"]) > 0 and int(counts["LDG"]) > 0, result.stdout
    assert "no spills" in result.stdout
