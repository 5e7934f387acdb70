"""The Hopper MoE GEMV for MXFP4 experts (Gluon, kernels/moe_gemv_sm90.py): opt-in, and no interpreter
runs Gluon, so on the CPU it must compile for sm90 (no spills, nothing changing threads in its K loop)
and stay out of fused_moe's way; its numerics against the reference are GPU tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from closeness import assert_close_to_scale  # this folder (pytest puts it on sys.path)
from launch_spy import LaunchSpy  # tests/
from seeded import randn as _randn  # this folder

from tritonllm import platform
from tritonllm.kernels import gemv_w4_sm90, launch, moe_gemv_sm90, reference
from tritonllm.kernels.gemm import GemmTiles
from tritonllm.kernels.moe import fused_moe
from tritonllm.kernels.moe_tiles import MoeTiles
from tritonllm.kernels.quant_formats import FP4, QuantScheme
from tritonllm.quantization.quantize import quantize_experts

ROOT = Path(__file__).resolve().parents[2]
MXFP4 = QuantScheme(FP4, "mx", "none")
needs_sm90 = pytest.mark.skipif(
    not (platform.is_gpu() and moe_gemv_sm90.available()), reason="the Gluon MoE GEMV runs on sm90 GPUs only"
)

COMPILE = """
import re, sys
sys.path.insert(0, "scripts")
from cross_compile_attention import disassemble
from sass_loop_mix import loop_mix
from tritonllm.kernels import moe_gemv_sm90 as m
for gated, activation, bias, sums in ((True, 1, True, False), (False, 1, True, False), (True, 0, False, False),
                                      (False, 1, True, True)):
    for even in (True, False):
        kernel = m.compile_sm90(gated=gated, even=even, activation=activation, bias=bias, sum_slots=sums)
        sass = disassemble(kernel)
        ops = loop_mix(sass)
        spills = "spills" if "LDL" in sass or "STL" in sass else "ok"
        print(gated, even, sums, spills, ops["BAR"] + ops["STS"] + ops["LDS"])
"""


@pytest.mark.skipif(not gemv_w4_sm90.HAVE_GLUON, reason="this Triton has no Gluon")
def test_compiles_for_sm90_without_spills_or_layout_changes_in_its_loop() -> None:
    """w13 (gate and up rows interleaved, gpt-oss's activation and biases, or Qwen3's SiLU without) and w2 (top-k
    weights; per-slot rows, or its slots summed in the launch with its first weights read before the PDL wait), K a
    multiple of the K tile and not: built with Triton's ptxas (a subprocess: this one runs the
    interpreter), no local memory, and no barrier or shared-memory access in the K loop."""
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", COMPILE], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = [line.split() for line in result.stdout.splitlines() if line.startswith(("True", "False"))]
    assert len(lines) == 8, result.stdout
    assert all(spills == "ok" and moves == "0" for *_, spills, moves in lines), result.stdout


def _problem(t: int, e: int, h: int, i: int, top_k: int, seed: int, dtype: torch.dtype) -> tuple[tuple, dict]:
    weights, ids = reference.moe_route(_randn(t, e, seed=seed, dtype=torch.float32), top_k, True)
    w13 = quantize_experts(_randn(e, 2 * i, h, seed=seed + 1) * h**-0.5, MXFP4)  # outputs O(1)
    w2 = quantize_experts(_randn(e, h, i, seed=seed + 2) * i**-0.5, MXFP4)
    biases = dict(
        w13_bias=_randn(e, 2 * i, seed=seed + 3, dtype=dtype), w2_bias=_randn(e, h, seed=seed + 4, dtype=dtype)
    )
    return (_randn(t, h, seed=seed + 5, dtype=dtype), w13, w2, weights, ids), biases


def test_fused_moe_leaves_it_alone_unless_switched_on_and_on_hopper(monkeypatch) -> None:
    """Off by default; switched on, a machine without an sm90 GPU keeps the Triton GEMV (same result)."""
    monkeypatch.delenv("TRITONLLM_MOE_GEMV_GLUON", raising=False)
    assert not moe_gemv_sm90.enabled()
    monkeypatch.setenv("TRITONLLM_MOE_GEMV_GLUON", "1")
    assert moe_gemv_sm90.enabled()
    if platform.is_gpu() and moe_gemv_sm90.available():
        pytest.skip("an sm90 GPU: the kernel runs here (test_matches_the_reference)")
    args, biases = _problem(3, 6, 64, 96, 2, seed=70, dtype=platform.DEFAULT_DTYPE)
    t = GemmTiles(1, 16, 64, 1, 1, 1, gemv=True)
    got = fused_moe(*args, tiles=MoeTiles(t, t), activation="swiglu_oai", **biases)
    tol = 4e-5 if platform.DEFAULT_DTYPE == torch.float32 else 2e-2
    assert_close_to_scale(got, reference.fused_moe(*args, activation="swiglu_oai", **biases), tol)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("activation", ["swiglu_oai", "silu"])
@pytest.mark.parametrize(
    "t, e, h, i, top_k",
    [(1, 32, 2880, 2880, 4), (3, 8, 2880, 2880, 4), (2, 6, 256, 192, 2), (4, 5, 96, 4160, 3), (2, 4, 4096, 64, 1)],
)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("sums", [True, False], ids=["slots_summed", "per_slot_rows"])
def test_matches_the_reference(activation, bias, sums, t, e, h, i, top_k, monkeypatch) -> None:
    """Switched on, both launches run the Gluon kernel and the layer matches the reference: gpt-oss's
    shape (K = 2880: rows of 360 words, three K tiles of 1,024 columns, the last masked), small ones (K within one
    tile), K beyond one K tile (4160), w13's K whole K tiles (4096: the unmasked path) with top_k 1 (w2 stores
    straight into the output); with and without biases (Qwen3-MoE: SiLU, none); w2 summing the slots itself
    (its first weights read before the PDL wait, under PDL as the engine launches it) or writing a row a slot.
    Summed twice, the layer gives the same bits (the slots summed in order) and leaves the counters at zero."""
    monkeypatch.setenv("TRITONLLM_MOE_GEMV_GLUON", "1")
    if not sums:
        monkeypatch.setattr(moe_gemv_sm90, "sums_slots", lambda *args: False)
    spy = LaunchSpy.install(monkeypatch, moe_gemv_sm90, "moe_w4_gemv_sm90_kernel")
    args, biases = _problem(t, e, h, i, top_k, seed=71 + t, dtype=torch.bfloat16)
    tiles = MoeTiles(*[GemmTiles(1, 16, 512, 4, 2, 1, gemv=True)] * 2)
    biases = biases if bias else {}
    pdl = launch.pdl_on()
    launch.set_pdl(True)
    try:
        got = fused_moe(*args, tiles=tiles, activation=activation, **biases)
        again = fused_moe(*args, tiles=tiles, activation=activation, **biases)
    finally:
        launch.set_pdl(pdl)
    expected = reference.fused_moe(*args, activation=activation, **biases)
    assert_close_to_scale(got, expected, 2e-2)
    assert spy.launches == 4, "the Gluon MoE GEMV did not run"
    assert torch.equal(got, again)
    assert int(launch.arrival_counters(got.device).abs().sum()) == 0


def test_sums_slots_where_the_counters_serve() -> None:
    """w2 sums a token's slots itself with more than one slot and a counter for each token's row block."""
    blocks = -(-2880 // moe_gemv_sm90._block_n(False))
    cpu = torch.device("cpu")
    assert moe_gemv_sm90.sums_slots(1, 4, 2880, cpu)
    assert not moe_gemv_sm90.sums_slots(1, 1, 2880, cpu)  # one slot: w2 writes the output row itself
    assert moe_gemv_sm90.sums_slots(launch.MAX_ARRIVAL_COUNTERS // blocks, 4, 2880, cpu)
    assert not moe_gemv_sm90.sums_slots(launch.MAX_ARRIVAL_COUNTERS // blocks + 1, 4, 2880, cpu)
