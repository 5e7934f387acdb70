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


def test_mid_cases_are_tuned_per_shape_up_to_tuned_max_m() -> None:
    """The mid suite sweeps the float GEMM at prefill chunks (M = 128..512) and --write-tuned keeps its
    winners (kernels/gemm.py reads them up to TUNED_MAX_M); larger M stays with the M-bucket tables."""
    from tritonllm.kernels import gemm as g

    cases = tune_gemm.cases(["mid"])
    assert {(fmt, m) for fmt, _, _, m, _ in cases} == {("float", m) for m in (128, 256, 512)}
    assert all(split <= tiles.max_split_k for *_, cands in cases for tiles, split in cands)

    def row(m: int, us: float, block_m: int) -> dict:
        tiles = dict(block_m=block_m, block_n=128, block_k=64, num_warps=4, num_stages=4)
        return dict(impl="triton", format="float", n=4096, k=14336, m=m, us=us, rel_error=1e-3, tiles=tiles, split=2)

    rows = [row(512, 90.0, 64), row(512, 80.0, 128), row(1024, 50.0, 64), dict(row(256, 1.0, 32), rel_error=0.5)]
    table = tune_gemm.tuned_table(rows)["float"]["4096,14336"]
    assert set(table) == {"512"} and table["512"]["block_m"] == 128 and table["512"]["split"] == 2
    assert g.TUNED_MAX_M >= 512


def test_mid_fp8_cases_write_w8a8_buckets_that_fit_shared_memory() -> None:
    """The mid_fp8 suite sweeps FP8 W8A8 at M = 128..512 (batch 1's prompt); its winners go under the
    w8a8 kind that gemm() looks up for FP8 per-channel weights, and every candidate's stages fit Hopper's
    shared memory with 1-byte operands (so fit_shared_memory never changes what was timed)."""
    from tritonllm.kernels import gemm as g

    cases = tune_gemm.cases(["mid_fp8"])
    assert {(fmt, m) for fmt, _, _, m, _ in cases} == {("fp8", m) for m in (128, 256, 512)}
    for *_, cands in cases:
        for tiles, split in cands:
            assert split <= tiles.max_split_k
            assert g.fit_shared_memory(tiles, 1, 1, "hopper") == tiles
    rows = [dict(impl="triton", format="fp8", n=6144, k=4096, m=512, us=20.0, rel_error=1e-3, split=1,
                 tiles=dict(block_m=128, block_n=256, block_k=128, num_warps=8, num_stages=3, persistent=True))]  # fmt: skip
    assert tune_gemm.tuned_table(rows)["w8a8"]["6144,4096"]["512"]["block_n"] == 256
