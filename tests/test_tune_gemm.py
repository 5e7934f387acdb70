"""scripts/tune_gemm.py --write-tuned --update: a sweep's entries go in per (kind, shape, M bucket)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_path = Path(__file__).resolve().parents[1] / "scripts" / "tune_gemm.py"
_spec = importlib.util.spec_from_file_location("tune_gemm", _path)
tune_gemm = importlib.util.module_from_spec(_spec)
sys.modules["tune_gemm"] = tune_gemm
_spec.loader.exec_module(tune_gemm)


def test_a_sweep_of_some_buckets_keeps_the_others() -> None:
    old = {
        "device": "GPU",
        "w4a16": {"4096,4096": {"1": "old1", "16": "old16"}, "6144,4096": {"1": "keep"}},
        "float": {"4096,4096": {"1": "f1"}},
    }
    new = {"device": "GPU", "triton": "3.6", "w4a16": {"4096,4096": {"1": "new1", "4": "new4"}, "1,2": {"1": "x"}}}
    merged = tune_gemm.merge_tuned(old, new)
    assert merged["w4a16"] == {
        "4096,4096": {"1": "new1", "4": "new4", "16": "old16"},
        "6144,4096": {"1": "keep"},
        "1,2": {"1": "x"},
    }
    assert merged["float"] == old["float"] and merged["triton"] == "3.6"
    assert old["w4a16"]["4096,4096"] == {"1": "old1", "16": "old16"}  # the inputs are not modified
