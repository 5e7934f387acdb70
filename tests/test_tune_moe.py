"""scripts/tune_moe.py on the CPU (the interpreter, its "tiny" shape, a few candidates): every launch
it times, the GEMV's variants included, matches its float32 expectation, and the table records
which variant won."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tritonllm.kernels.gemm import GemmTiles

_scripts = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(_scripts))
_spec = importlib.util.spec_from_file_location("tune_moe", _scripts / "tune_moe.py")
tune_moe = importlib.util.module_from_spec(_spec)
sys.modules["tune_moe"] = tune_moe
_spec.loader.exec_module(tune_moe)


def test_the_gemv_sweep_times_its_variants_and_the_table_records_the_winners(monkeypatch) -> None:
    gemv = [GemmTiles(1, 16, 32, 1, 2, 1, gemv=True), GemmTiles(1, 32, 64, 1, 2, 1, gemv=True)]
    monkeypatch.setattr(tune_moe, "candidates", lambda kind, block_m: gemv if block_m == 1 else [])
    monkeypatch.setattr(tune_moe, "block_ms", lambda tokens, e, top_k: [1])
    e, _, h, i = tune_moe.SHAPES["tiny"]
    for kind in ("bfloat16", "mxfp4"):
        rows = tune_moe.sweep("tiny", kind, 3, tune_moe.make_experts(kind, e, h, i), rep=1)
        assert sorted({r["gemm"] for r in rows}) == ["w13", "w13_joint", "w2", "w2_slots"]
        assert all("us" in r and r["rel_error"] < 1e-4 for r in rows), [r for r in rows if "us" not in r]
        entry = tune_moe.tuned_table(rows)[kind][f"{e},{h},{i}"]["3"]
        assert set(entry) == {"w13", "w2", "us", "joint", "sum_slots"}
        # each launch in turn the fastest, the plain launches next: the table follows the times
        for fast in ("w13_joint", "w2_slots", "w13", "w2"):
            timed = [dict(r, us=0.5 if r["gemm"] == fast else 1.0 if r["gemm"] in ("w13", "w2") else 2.0) for r in rows]
            won = tune_moe.tuned_table(timed)[kind][f"{e},{h},{i}"]["3"]
            assert won["joint"] == (fast == "w13_joint") and won["sum_slots"] == (fast == "w2_slots")


def test_a_wrong_launch_is_left_out_of_the_table(monkeypatch) -> None:
    """A variant whose output is off (here: w2_slots with a slot dropped) has a large rel_error and
    cannot win, however fast."""
    gemv = [GemmTiles(1, 16, 32, 1, 2, 1, gemv=True)]
    monkeypatch.setattr(tune_moe, "candidates", lambda kind, block_m: gemv)
    monkeypatch.setattr(tune_moe, "block_ms", lambda tokens, e, top_k: [1])
    real = tune_moe._expected
    monkeypatch.setattr(
        tune_moe, "_expected", lambda case, which: real(case, which) * (1.5 if which == "w2_slots" else 1.0)
    )
    e, _, h, i = tune_moe.SHAPES["tiny"]
    rows = tune_moe.sweep("tiny", "bfloat16", 3, tune_moe.make_experts("bfloat16", e, h, i), rep=1)
    slots = [r for r in rows if r["gemm"] == "w2_slots"]
    assert slots and all(r["rel_error"] > 0.2 for r in slots)
    timed = [dict(r, us=0.1 if r["gemm"] == "w2_slots" else r["us"] + 1) for r in rows]
    assert not tune_moe.tuned_table(timed)["bfloat16"][f"{e},{h},{i}"]["3"]["sum_slots"]


def test_the_grouped_sweep_times_the_descriptor_reads(monkeypatch) -> None:
    grouped = [GemmTiles(16, 16, 32, 1, 1, 1)]
    monkeypatch.setattr(tune_moe, "candidates", lambda kind, block_m: grouped)
    monkeypatch.setattr(tune_moe, "block_ms", lambda tokens, e, top_k: [16])
    e, _, h, i = tune_moe.SHAPES["tiny"]
    rows = tune_moe.sweep("tiny", "bfloat16", 7, tune_moe.make_experts("bfloat16", e, h, i), rep=1)
    assert sorted(r["gemm"] for r in rows) == ["w13", "w13_tma", "w2", "w2_sorted", "w2_sorted_tma", "w2_tma"]
    assert all("us" in r and r["rel_error"] < 1e-4 for r in rows), rows
    for fast, expect in (("w2_tma", (False, True, False)), ("w2_sorted_tma", (False, True, True)),
                         ("w2_sorted", (False, False, True)), ("w13_tma", (True, False, False))):  # fmt: skip
        timed = [dict(r, us=0.5 if r["gemm"] == fast else 1.0 if r["gemm"] in ("w13", "w2") else 2.0) for r in rows]
        entry = tune_moe.tuned_table(timed)["bfloat16"][f"{e},{h},{i}"]["7"]
        assert (entry["tma_w13"], entry["tma_w2"], entry["sorted_w2"]) == expect and "joint" not in entry


@pytest.mark.parametrize(
    "block_m, top_k, kind, expect",
    [(16, 2, "bfloat16", ("w13", "w2", "w2_sorted", "w13_tma", "w2_tma", "w2_sorted_tma")),
     (16, 2, "mxfp4", ("w13", "w2", "w2_sorted")),
     (1, 1, "bfloat16", ("w13", "w13_joint", "w2"))],
)  # fmt: skip
def test_launches(block_m, top_k, kind, expect) -> None:
    assert tune_moe.launches(block_m, top_k, kind) == expect
