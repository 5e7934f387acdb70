"""The Hopper int4 tensor-core GEMM (Gluon, kernels/gemm_w4_sm90.py) against x @ dequant(w).T at
M = 2..64, its plans, dispatch and SASS. The kernel needs an sm90 GPU (no interpreter runs Gluon):
its numerics are GPU tests; on the CPU it must compile for sm90 and stay out of gemm()'s way."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import w4_checks as w4  # this folder
from closeness import assert_close_to_scale  # this folder (pytest puts it on sys.path)
from launch_spy import LaunchSpy  # tests/
from seeded import randn as _randn  # this folder
from sm90_build import sm90_build_report  # this folder

from tritonllm import platform
from tritonllm.kernels import gemm_w4_sm90, gemm_w4_tma_sm90, reference
from tritonllm.quantization.quantize import quantize_weight

needs_sm90 = pytest.mark.skipif(
    not (platform.is_gpu() and gemm_w4_sm90.available()), reason="the Gluon W4 GEMM runs on sm90 GPUs only"
)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def spy(monkeypatch) -> LaunchSpy:
    spy = LaunchSpy.install(monkeypatch, gemm_w4_sm90, "w4_gemm_sm90_kernel")
    monkeypatch.setattr(gemm_w4_tma_sm90, "FORCE", "never")  # the TMA kernel would take these shapes first
    return spy


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m", [2, 5, 16, 17, 33, 64])
@pytest.mark.parametrize("n, k", [(45, 256), (130, 4224), (1000, 1024)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_matches_the_dequantized_weight(group, m, n, k, dtype, spy) -> None:
    """Ragged M (rows past M masked) and N, K of 2 to 33 steps, every group size, both 16-bit dtypes,
    with the bias (one split) and the plan's K splits."""
    w4.check_against_dequantized(m, n, k, w4.int4_scheme(group), dtype, seed=70)
    assert spy.launches == 1, "the Gluon W4 GEMM did not run"


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m", [2, 17, 64])
@pytest.mark.parametrize("n, k", [(45, 256), (130, 4224), (1000, 1024)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_scale_after_matches_the_dequantized_weight(m, n, k, dtype, monkeypatch, spy) -> None:
    """The scale applied after each step's MMA (int4, groups of 128; TRITONLLM_W4_SCALE_AFTER=1): ragged
    shapes, both 16-bit dtypes, the bias and the plan's K splits (the asynchronous MMA off: it would replace it)."""
    monkeypatch.setattr(gemm_w4_sm90, "SCALE_AFTER", "1")
    monkeypatch.setattr(gemm_w4_sm90, "ASYNC_MMA", "0")
    w4.check_against_dequantized(m, n, k, w4.int4_scheme(128), dtype, seed=90)
    assert spy.launches == 1


@pytest.mark.gpu
@needs_sm90
def test_scale_after_decodes_every_code_exactly_and_a_broken_mask_is_caught(monkeypatch, spy) -> None:
    monkeypatch.setattr(gemm_w4_sm90, "SCALE_AFTER", "1")
    monkeypatch.setattr(gemm_w4_sm90, "ASYNC_MMA", "0")
    w4.check_every_int4_code(128)
    assert spy.launches == 8
    w4.check_broken_mask_caught(gemm_w4_sm90, monkeypatch)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m", [2, 17, 64])
@pytest.mark.parametrize("n, k", [(45, 256), (130, 4224)])
@pytest.mark.parametrize("plan", [None, "64:3:1", "128:1:0:8"])
def test_mxfp4_matches_the_dequantized_weight(m, n, k, plan, monkeypatch, spy) -> None:
    """MXFP4 (e2m1, e8m0 per 32; bf16 activations), with the bias, K splits and two warpgroups."""
    if plan:
        monkeypatch.setattr(gemm_w4_sm90, "PLAN_OVERRIDE", gemm_w4_sm90.Plan.parse(plan))
    w4.check_against_dequantized(m, n, k, w4.MXFP4, torch.bfloat16, seed=80)
    assert spy.launches == 1


@pytest.mark.gpu
@needs_sm90
def test_every_e2m1_code_decodes_exactly(spy) -> None:
    """Every e2m1 code (the subnormal 0.5 too) under scales 2**-27 .. 2**23, picked out column by column
    with one-hot activations (all 128 columns of a K step): exact."""
    w4.check_every_e2m1_code()
    assert spy.launches == 8


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(
    "plan",
    [
        "128:1:1",
        "128:3:1",
        "64:2:0",
        "64:1:1",
        "128:5:0",
        "128:2:1:8",
        "256:1:1:8",
        "256:2:1:16",
        "64:3:1:4:1",
        "128:2:0:8:1",
        "256:1:1:16:1",
        "64:3:2",  # words two steps ahead (session 21, opt-in)
        "64:2:1:4:0:0",  # the activation loaded at its own step
        "64:4:2:4:0:0",
        "64:3:2:4:1:0",
        "128:2:2:8",
    ],
)
@pytest.mark.parametrize("m", [3, 24, 64])
def test_every_plan_matches(plan, m, monkeypatch, spy) -> None:
    """Rows a program, K splits (uneven: the last split shorter; summed in the kernel, the same bits on a
    second call, the counters back at zero), prefetch on and off, two and four warpgroups, at K = 4,224
    and 4,096."""
    monkeypatch.setattr(gemm_w4_sm90, "PLAN_OVERRIDE", gemm_w4_sm90.Plan.parse(plan))
    w4.check_plan(m, 200, seed=73)
    assert spy.launches == 4


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("fmt", ["int4-g32", "int4-g128", "mxfp4"])
@pytest.mark.parametrize("m", [65, 128, 129, 300])
@pytest.mark.parametrize("n, k", [(130, 4224), (1000, 1024)])
@pytest.mark.parametrize("plan", [None, "128:1:1:8:0:0", "64:1:1:4", "64:3:1:4:0:0"])
def test_row_blocks_match_the_dequantized_weight(fmt, m, n, k, plan, monkeypatch, spy) -> None:
    """Beyond 64 rows (prefill chunks): 128 activation rows a program, one program per weight tile and row
    block (M_TILED: the last block ragged), or one block's K split, in bf16 and fp16, with the bias; the
    same bits on a second call."""
    if plan:
        monkeypatch.setattr(gemm_w4_sm90, "PLAN_OVERRIDE", gemm_w4_sm90.Plan.parse(plan))
    scheme = w4.MXFP4 if fmt == "mxfp4" else w4.int4_scheme(int(fmt.split("g")[1]))
    for dtype in (torch.bfloat16,) if fmt == "mxfp4" else (torch.bfloat16, torch.float16):
        w4.check_against_dequantized(m, n, k, scheme, dtype, seed=m + n)
    assert spy.launches == (1 if fmt == "mxfp4" else 2)
    assert {call["M_TILED"] for call in spy.calls} == {m > 128}


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("fmt", ["int4-g32", "int4-g128", "mxfp4"])
@pytest.mark.parametrize("m", [3, 64, 65, 128, 300])
@pytest.mark.parametrize("plan", ["128:1:1:8:0:1:1", "128:1:1:8:0:0:1", "64:2:1:4:0:0:1", "64:3:1:4:0:1:1"])
def test_async_mma_plans_match_the_dequantized_weight(fmt, m, plan, monkeypatch, spy) -> None:
    """ASYNC_MMA (two K steps an iteration, the first's MMA asynchronous under the second's decode): taken
    where every split has an even number of K steps (K = 1,024: 8 steps; three splits of 3,072: 8, 8 and 8),
    and then the same result as the dequantized weight's product; at an odd count (K = 1,152) the
    synchronous loop runs instead."""
    monkeypatch.setattr(gemm_w4_sm90, "PLAN_OVERRIDE", gemm_w4_sm90.Plan.parse(plan))
    scheme = w4.MXFP4 if fmt == "mxfp4" else w4.int4_scheme(int(fmt.split("g")[1]))
    k = 3072 if plan.startswith("64:3") else 1024
    w4.check_against_dequantized(m, 200, k, scheme, torch.bfloat16, seed=m + 7)
    w4.check_against_dequantized(m, 200, 1152, scheme, torch.bfloat16, seed=m + 8)
    assert [call["ASYNC_MMA"] for call in spy.calls] == [True, False]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("fmt", ["int4-g128", "mxfp4"])
def test_default_plans_take_the_asynchronous_mma_where_planned(fmt, monkeypatch, spy) -> None:
    """The default plans (ASYNC_MMA "auto"): asynchronous at M = 4 / 16 (int4 g128: instead of the scale after the
    MMA) and beyond 64 rows, synchronous at 32 / 64; each result the dequantized weight's product."""
    monkeypatch.setattr(gemm_w4_sm90, "ASYNC_MMA", "auto")
    monkeypatch.setattr(gemm_w4_sm90, "SCALE_AFTER", "auto")
    scheme = w4.MXFP4 if fmt == "mxfp4" else w4.int4_scheme(128)
    ms = (4, 16, 32, 64, 100)
    for m in ms:
        w4.check_against_dequantized(m, 200, 1024, scheme, torch.bfloat16, seed=m + 9)
    assert [(call["ASYNC_MMA"], call["SCALE_AFTER"]) for call in spy.calls] == [
        (True, False),
        (True, False),
        (False, fmt != "mxfp4"),
        (False, False),
        (True, False),
    ]


@pytest.mark.gpu
@needs_sm90
def test_row_blocks_serve_gemm_up_to_max_m(monkeypatch, spy) -> None:
    """TRITONLLM_W4_SM90_MAX_M: gemm()'s measured-faster dispatch (the triton_sm90 linear) sends M up to it
    here, before the dequantize-first tiles of M > 64; beyond it, those tiles."""
    monkeypatch.setattr(gemm_w4_sm90, "MAX_M", 256)
    for m, launches in ((200, 1), (256, 2), (257, 2)):
        w4.check_against_dequantized(m, 200, 512, w4.int4_scheme(128), torch.bfloat16, seed=m, mode="faster")
        assert spy.launches == launches, m


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("group", [32, 128])
def test_every_code_decodes_exactly(group, spy) -> None:
    """Every int4 code under zero points 0 / 8 / 15 / 3 and power-of-two scales, picked out column by
    column with one-hot activations (all 128 columns of a K step: the column permutation): exact."""
    w4.check_every_int4_code(group)
    assert spy.launches == 8


@pytest.mark.gpu
@needs_sm90
def test_a_broken_decode_is_caught(monkeypatch) -> None:
    """Negative check: with the nibble mask shifted the kernel's output fails the same comparison."""
    monkeypatch.setattr(gemm_w4_tma_sm90, "FORCE", "never")
    w4.check_broken_mask_caught(gemm_w4_sm90, monkeypatch)


def test_the_gemm_launches_without_pdl_and_the_gemv_with_it(monkeypatch) -> None:
    """With PDL on, gemm() launches the W4 GEMV (M = 1) with it and the W4 GEMM (M = 2..64) without it: the
    GEMM's grids under PDL made Llama-3-8B int4 decode steps 16% longer at 64 sequences (H200, session 20)."""
    from tritonllm.kernels import gemv_w4_sm90, launch

    launches = []

    def record(name):
        def launch_stub(a, words, c, bias, scale, zero, group_k, fp4, pdl):
            launches.append((name, a.shape[0], pdl))
            return c

        return launch_stub

    monkeypatch.setattr(launch, "_PDL", [True])
    monkeypatch.setattr(gemm_w4_tma_sm90, "FORCE", "never")
    monkeypatch.setattr(gemm_w4_sm90, "takes", lambda *args: True)
    monkeypatch.setattr(gemv_w4_sm90, "takes", lambda *args: True)
    monkeypatch.setattr(gemm_w4_sm90, "w4_gemm_sm90", record("gemm"))
    monkeypatch.setattr(gemv_w4_sm90, "w4_gemv_sm90", record("gemv"))
    weight = quantize_weight(_randn(16, 256, seed=80), w4.int4_scheme(128))
    for m in (1, 2, 64):
        w4.w4_gemm(_randn(m, 256, seed=81, dtype=platform.DEFAULT_DTYPE), weight)
    with_pdl = {"PDL": True, "launch_pdl": True}
    assert launches == [("gemv", 1, with_pdl), ("gemm", 2, {"PDL": False}), ("gemm", 64, {"PDL": False})]


def test_gemm_leaves_it_alone_off_hopper(spy) -> None:
    """Without an sm90 GPU (here: the interpreter) gemm() at M = 2..64 runs the portable kernels."""
    if platform.is_gpu() and gemm_w4_sm90.available():
        pytest.skip("an sm90 GPU: the kernel is meant to run here")
    weight = quantize_weight(_randn(16, 256, seed=78), w4.int4_scheme(32))
    x = _randn(3, 256, seed=79, dtype=platform.DEFAULT_DTYPE)
    assert_close_to_scale(w4.w4_gemm(x, weight), x.float() @ reference.dequantize_weight(weight).T, 1e-2)
    assert spy.launches == 0


def test_measured_faster_at_m_2_to_64(monkeypatch) -> None:
    """int4 and MXFP4 (measured on the H200 in session 14) at M = 2..64; M = 1 is the GEMV's; beyond 64 up to
    MAX_M (TRITONLLM_W4_SM90_MAX_M, 128 unless set: one row block, session 39)."""
    assert gemm_w4_sm90.MAX_M == int(os.environ.get("TRITONLLM_W4_SM90_MAX_M", "128"))
    monkeypatch.setattr(gemm_w4_sm90, "MAX_M", 64)
    assert gemm_w4_sm90.measured_faster(16, 4096, 4096) and gemm_w4_sm90.measured_faster(64, 4096, 4096, fp4=True)
    assert not gemm_w4_sm90.measured_faster(1, 4096, 4096) and not gemm_w4_sm90.measured_faster(65, 4096, 4096)
    monkeypatch.setattr(gemm_w4_sm90, "MAX_M", 512)
    assert gemm_w4_sm90.measured_faster(512, 4096, 4096) and not gemm_w4_sm90.measured_faster(513, 4096, 4096)


def test_supported_shapes_and_plans(monkeypatch) -> None:
    supported = gemm_w4_sm90.supported
    assert supported(2, 4096, 128) == supported(64, 4096, 32) == gemm_w4_sm90.HAVE_GLUON
    assert not supported(1, 4096, 128)  # M = 1: the GEMV
    assert supported(65, 4096, 128) == supported(8192, 4096, 32) == gemm_w4_sm90.HAVE_GLUON  # row blocks
    assert not supported(16, 4160, 32)  # K not whole 128-column steps
    assert not supported(16, 4096, 4096)  # one group over all of K
    assert [gemm_w4_sm90.block_m(m) for m in (2, 16, 17, 32, 33, 64, 65, 300)] == [16, 16, 32, 32, 64, 64, 128, 128]
    assert [gemm_w4_sm90.m_blocks(m) for m in (2, 64, 65, 128, 129, 512)] == [1, 1, 1, 1, 2, 4]
    assert gemm_w4_sm90.Plan.parse("64:3:0") == gemm_w4_sm90.Plan(64, 3, False)
    assert gemm_w4_sm90.Plan.parse("128:2:1:8") == gemm_w4_sm90.Plan(128, 2, True, 8)
    assert gemm_w4_sm90.Plan.parse("64:4:1:4:1") == gemm_w4_sm90.Plan(64, 4, True, 4, scale_after=True)
    assert gemm_w4_sm90.Plan.parse("64:4:2:4:0:0") == gemm_w4_sm90.Plan(64, 4, 2, 4, False, x_ahead=False)
    assert gemm_w4_sm90.Plan.parse("128:1:1:8:0:1:1") == gemm_w4_sm90.Plan(128, 1, True, 8, async_mma=True)
    # the asynchronous MMA by default at M <= 16 and beyond 64 (row blocks), not at 17..64 (timed slower there)
    monkeypatch.setattr(gemm_w4_sm90, "ASYNC_MMA", "auto")
    assert [gemm_w4_sm90.plan(m, 28672, 4096).async_mma for m in (2, 16, 17, 64, 65, 300)] == [True] * 2 + [
        False
    ] * 2 + [True] * 2
    monkeypatch.setattr(gemm_w4_sm90, "ASYNC_MMA", "0")
    assert not any(gemm_w4_sm90.plan(m, 28672, 4096).async_mma for m in (2, 65))
    assert gemm_w4_sm90.plan(65, 28672, 4096).x_ahead  # the synchronous 128-row plan: the activation a step ahead
    monkeypatch.setattr(gemm_w4_sm90, "ASYNC_MMA", "1")
    assert gemm_w4_sm90.plan(32, 6144, 4096).async_mma
    monkeypatch.setattr(gemm_w4_sm90, "ASYNC_MMA", "auto")
    # ASYNC_MMA's two steps an iteration: every split's K steps even (the last split what is left)
    assert gemm_w4_sm90.even_steps(4096, 2048) and gemm_w4_sm90.even_steps(3072, 1024)
    assert not gemm_w4_sm90.even_steps(4224, 4224) and not gemm_w4_sm90.even_steps(4096, 1408)
    plan = gemm_w4_sm90.plan(16, 6144, 4096)
    assert plan.block_n == 64 and 1 <= plan.split <= 4
    assert gemm_w4_sm90.plan(16, 4096, 512).split == 1  # each split at least four K steps
    sms = platform.num_multiprocessors()
    wide = gemm_w4_sm90.plan(32, 128 * sms, 4096)  # 128-row programs fill the SMs: two warpgroups, no split
    assert wide == gemm_w4_sm90.Plan(128, 1, True, 8, scale_after=True)
    assert gemm_w4_sm90.plan(64, 128 * sms, 4096, fp4=True) == gemm_w4_sm90.Plan(256, 1, True, 16)  # MXFP4 M > 32
    assert gemm_w4_sm90.plan(64, 128 * sms, 4096) == gemm_w4_sm90.Plan(128, 1, True, 8)


def test_row_block_plans(monkeypatch) -> None:
    """Beyond 64 rows on 132 SMs: 128 weight rows and two warpgroups where weight tiles x row blocks fill the
    SMs (the activation a step ahead for MXFP4, at its step for int4), else 64 rows, one warpgroup, K split only
    while one row block covers M (the activation at its own step: registers); the asynchronous MMA; no scale after
    the MMA."""
    monkeypatch.setattr(gemm_w4_sm90.platform, "num_multiprocessors", lambda: 132)
    monkeypatch.setattr(gemm_w4_sm90, "ASYNC_MMA", "auto")
    # asynchronous MMAs; int4's 128-row plan with the activation at its step, MXFP4's a step ahead
    wide = gemm_w4_sm90.Plan(128, 1, True, 8, x_ahead=False, async_mma=True)
    assert gemm_w4_sm90.plan(65, 28672, 4096) == gemm_w4_sm90.plan(512, 6144, 4096) == wide  # 224; 48 x 4 programs
    assert gemm_w4_sm90.plan(65, 28672, 4096, fp4=True) == gemm_w4_sm90.Plan(128, 1, True, 8, async_mma=True)
    narrow = gemm_w4_sm90.Plan(64, 1, True, 4, x_ahead=False, async_mma=True)
    assert gemm_w4_sm90.plan(512, 4096, 14336) == narrow  # 32 x 4 < 132
    assert gemm_w4_sm90.plan(128, 4096, 4096) == dataclasses.replace(narrow, split=2)  # 64 tiles x 2
    assert gemm_w4_sm90.plan(65, 6144, 4096).split == 2  # 96 tiles: two splits though 192 programs > 132
    assert gemm_w4_sm90.plan(128, 4096, 512).split == 1  # each split at least four K steps
    assert not gemm_w4_sm90.plan(300, 4096, 4096, fp4=True).scale_after


def test_activation_at_its_own_step_past_one_wave_of_64_row_tiles(monkeypatch) -> None:
    """On the H200's 132 SMs: qkv (96 programs x 4 splits) at M = 48 / 64 takes x_ahead off (four programs an SM
    instead of two), int4 and MXFP4 alike (session 44); o and down (64 x 4: one wave of two an SM) keep it, as
    does M <= 32."""
    monkeypatch.setattr(gemm_w4_sm90.platform, "num_multiprocessors", lambda: 132)
    for m in (33, 48, 64):
        for fp4 in (False, True):
            assert gemm_w4_sm90.plan(m, 6144, 4096, fp4) == gemm_w4_sm90.Plan(64, 4, x_ahead=False)
            assert gemm_w4_sm90.plan(m, 4096, 4096, fp4) == gemm_w4_sm90.Plan(64, 4)
            assert gemm_w4_sm90.plan(m, 4096, 14336, fp4) == gemm_w4_sm90.Plan(64, 4)
    assert gemm_w4_sm90.plan(32, 6144, 4096).x_ahead and gemm_w4_sm90.plan(32, 6144, 4096, fp4=True).x_ahead


def test_scale_after_is_on_to_m32_for_int4_only_and_forced_by_the_environment(monkeypatch) -> None:
    assert gemm_w4_sm90.SCALE_AFTER == os.environ.get("TRITONLLM_W4_SCALE_AFTER", "auto")
    monkeypatch.setattr(gemm_w4_sm90, "SCALE_AFTER", "auto")
    for m in (2, 16, 32):
        assert gemm_w4_sm90.plan(m, 6144, 4096).scale_after
    assert not gemm_w4_sm90.plan(33, 6144, 4096).scale_after  # M = 64's bucket: timed slower there
    assert not gemm_w4_sm90.plan(16, 6144, 4096, fp4=True).scale_after  # MXFP4 never
    monkeypatch.setattr(gemm_w4_sm90, "SCALE_AFTER", "0")
    assert not gemm_w4_sm90.plan(16, 6144, 4096).scale_after
    monkeypatch.setattr(gemm_w4_sm90, "SCALE_AFTER", "1")
    on = gemm_w4_sm90.plan(64, 6144, 4096)
    assert on == dataclasses.replace(gemm_w4_sm90.plan(64, 6144, 4096), scale_after=True)  # the same plan otherwise
    assert not gemm_w4_sm90.plan(16, 6144, 4096, fp4=True).scale_after


@pytest.mark.skipif(not gemm_w4_sm90.HAVE_GLUON, reason="this Triton has no Gluon")
@pytest.mark.parametrize(
    "fp4, scale_after, most",
    [(False, False, 3.6), (True, False, 4.5), (False, True, 2.9)],
    ids=["int4", "mxfp4", "int4-scale-after"],
)
def test_sm90_sass_per_weight(fp4: bool, scale_after: bool, most: float) -> None:
    """Built for sm90 with Triton's bundled ptxas (a subprocess: this one runs the interpreter): the K
    loop at 128 rows a program takes under `most` instructions a weight (int4: one shift and LOP3 a
    nibble pair, a packed subtract and FMA, its share of loads and MMAs (3.20); with the scale after
    the MMA no packed FMA, one float32 FMA an accumulator value (2.71); MXFP4: two shifts and two LOP3
    a pair, a packed multiply; the M = 1 GEMV: 4.7 / 5.7), no spills."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    args = [sys.executable, "scripts/sass_loop_mix.py", "--gemm", "--block-n", "128"] + (["--fp4"] if fp4 else [])
    args += ["--scale-after"] if scale_after else []
    result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    per_weight = float(re.search(r"([0-9.]+) a weight", result.stdout).group(1))
    assert 2 < per_weight < most, result.stdout
    assert "no spills" in result.stdout
    assert result.stdout.count("HGMMA") == 1  # tensor cores, not FMAs


@pytest.mark.skipif(not gemm_w4_sm90.HAVE_GLUON, reason="this Triton has no Gluon")
def test_m64_plan_options_build_for_sm90_without_spills() -> None:
    """Words two steps ahead and the activation loaded at its own step (opt-in plan fields, session 21)
    compile for sm90 at M = 64 without spills, and the activation at its step frees registers (181 -> 128 a
    thread on Triton 3.9: four programs an SM instead of two; 182 -> 150 on 3.6); so do the row-block builds beyond 64 rows
    (128 activation rows a program; the 128-row plan with the activation a step ahead, as the rows plan runs
    it: 216 / 231 registers a thread int4 / MXFP4 on Triton 3.6). A subprocess: this one runs the
    interpreter."""
    code = (
        "import json, os, subprocess, tempfile, triton\n"
        "from tritonllm.kernels import gemm_w4_sm90 as g\n"
        "tool = os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'cuobjdump')\n"
        "out = {}\n"
        "rows = dict(block_n=128, bm=128, warps=8, split=1, x_ahead=False, m_tiled=True)\n"
        "for name, kw in [('default', {}), ('x_at_step', {'x_ahead': False}), ('words2', {'prefetch': 2}),\n"
        "                 ('words2_x_at_step', {'prefetch': 2, 'x_ahead': False}), ('rows128', dict(rows, x_ahead=True)),\n"
        "                 ('rows128_fp4', dict(rows, fp4=True, x_ahead=True)),\n"
        "                 ('rows128_one_warpgroup', dict(rows, block_n=64, warps=4))]:\n"
        "    k = g.compile_sm90(**{'block_n': 64, 'bm': 64, 'split': 2, **kw})\n"
        "    f = tempfile.NamedTemporaryFile(suffix='.cubin', delete=False); f.write(k.asm['cubin']); f.close()\n"
        "    text = subprocess.run([tool, '--dump-resource-usage', f.name], capture_output=True, text=True).stdout\n"
        "    line = next(l for l in text.splitlines() if 'REG:' in l)\n"
        "    out[name] = [int(line.split('REG:')[1].split()[0]), int(line.split('STACK:')[1].split()[0])]\n"
        "print(json.dumps(out))\n"
    )
    usage = sm90_build_report(code)
    assert all(stack == 0 for _, stack in usage.values()), usage
    assert usage["x_at_step"][0] < usage["default"][0] - 24, usage  # 3.9: 181 -> 128; 3.6: 182 -> 150


@pytest.mark.skipif(not gemm_w4_sm90.HAVE_GLUON, reason="this Triton has no Gluon")
def test_async_mma_builds_unserialized_for_sm90() -> None:
    """The row blocks' ASYNC_MMA loop (int4 and MXFP4, the activation at its step and a step ahead) builds for
    sm90 with two K steps' MMAs a loop iteration, no spills, and no C7514 from ptxas (the MMAs serialized,
    which an accumulator in flight across the loop's back edge causes: session 42's one-step form did). A
    subprocess: this one runs the interpreter."""
    code = (
        "import json, os, subprocess, sys, tempfile, triton\n"
        "sys.path.insert(0, 'scripts')\n"
        "import sass_loop_mix\n"
        "from tritonllm.kernels import gemm_w4_sm90 as g\n"
        "try:  # the ptxas Triton builds sm90 with (3.9: ptxas-blackwell)\n"
        "    from triton.backends.nvidia.compiler import get_ptxas\n"
        "    ptxas = get_ptxas(90).path\n"
        "except ImportError:\n"
        "    ptxas = os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'ptxas')\n"
        "out = {}\n"
        "for fp4 in (False, True):\n"
        "    for xa in (False, True):\n"
        "        k = g.compile_sm90(block_n=128, bm=128, warps=8, split=1, m_tiled=True, fp4=fp4, x_ahead=xa,\n"
        "                           async_mma=True)\n"
        "        f = tempfile.NamedTemporaryFile(suffix='.ptx', delete=False, mode='w'); f.write(k.asm['ptx']); f.close()\n"
        "        r = subprocess.run([ptxas, '-arch=sm_90a', '-v', f.name, '-o', f.name + '.cubin'],\n"
        "                           capture_output=True, text=True)\n"
        "        loop = sass_loop_mix.loop_mix(sass_loop_mix.disassemble(k))\n"
        "        out[f'{fp4}-{xa}'] = [r.stdout + r.stderr, loop.get('HGMMA', 0)]\n"
        "print(json.dumps(out))\n"
    )
    builds = sm90_build_report(code)
    for name, (log, mmas) in builds.items():
        assert "C7514" not in log and "serialized" not in log, (name, log)
        assert re.search(r"\b0 bytes spill stores", log), (name, log)
        assert mmas == 16, (name, mmas)  # 8 a K step of 128 columns, two steps an iteration


def _emulated_step(words: torch.Tensor, s: torch.Tensor, z: torch.Tensor | None, fp4: bool, masks=None):
    """The kernel's decode of one K step (int32 words [N, 16], a thread's scale / zero point per 32
    columns [N, 4]; MXFP4: e8m0 exponents, z None) in torch, bit for bit: the 16-bit pairs, their packed
    arithmetic (one rounding to bf16, as the packed FMA / multiply), and the logical column each lands
    on. Returns (A [N, 128] in the MMA's logical column order, phys [128]: the physical column of each)."""
    mask, bias = masks or (gemm_w4_sm90.FP4_MASKS if fp4 else (gemm_w4_sm90.INT4_PAIR_MASK, gemm_w4_sm90.BF16_BIAS))
    n = words.shape[0]
    a = torch.zeros(n, 128)
    phys = torch.zeros(128, dtype=torch.long)

    def halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = (x & 0xFFFF).to(torch.int32), ((x >> 16) & 0xFFFF).to(torch.int32)
        as_bf16 = lambda h: (h << 16).view(torch.float32)  # noqa: E731 - a bf16's bits are a float32's top half
        return as_bf16(lo), as_bf16(hi)

    for wi in range(16):
        t, u = divmod(wi, 4)
        w = words[:, wi]
        for p in range(4):
            if fp4:
                m_src = (w << 6) if p == 0 else (w << 2) if p == 1 else (w >> (4 * p - 6))
                s_src = w if p == 3 else (w << (12 - 4 * p))
                lo, hi = halves((m_src & mask) | (s_src & bias))
                scale = torch.exp2(s[:, t].float() - 64)
                lo, hi = (lo * scale).bfloat16().float(), (hi * scale).bfloat16().float()
            else:
                lo, hi = halves(((w >> (4 * p)) & mask) | bias)
                sd = s[:, t].bfloat16().float()
                zs = (-(z[:, t].bfloat16().float() * sd)).bfloat16().float()
                lo = ((lo - 128.0).double() * sd + zs).bfloat16().float()
                hi = ((hi - 128.0).double() * sd + zs).bfloat16().float()
            c1, h = divmod(p, 2)
            for e, v in ((0, lo), (1, hi)):
                k = 16 * (2 * u + c1) + 8 * h + 2 * t + e
                a[:, k], phys[k] = v, 32 * t + 8 * u + p + 4 * e
    return a, phys


@pytest.mark.parametrize("fp4", [False, True], ids=["int4-g32", "mxfp4"])
def test_decode_and_column_order_in_torch(fp4: bool) -> None:
    """The kernel's bit-level decode and column mapping, emulated in torch for one K step: the A operand
    times the activations permuted the kernel's way equals the dequantized product (MXFP4 with the
    activations x 2**63, nothing taken back); a wrong magnitude mask, or a wrong permutation, fails."""
    n = 6
    weight = quantize_weight(_randn(n, 128, seed=84), w4.MXFP4 if fp4 else w4.int4_scheme(32))
    x = _randn(3, 128, seed=85).bfloat16().float()
    words = weight.data.cpu().contiguous().view(torch.int32)
    s, z = weight.scale.cpu(), None if fp4 else weight.zeros.cpu()
    expected = x @ reference.dequantize_weight(weight).cpu().T
    x_scale = 2.0**63 if fp4 else 1.0
    a, phys = _emulated_step(words, s, z, fp4)
    assert sorted(phys.tolist()) == list(range(128))
    assert_close_to_scale((x[:, phys] * x_scale) @ a.T, expected, 1e-2)
    with pytest.raises(AssertionError):  # the permutation matters
        assert_close_to_scale((x * x_scale) @ a.T, expected, 1e-2)
    wrong = (0x01C001C0 >> 1, gemm_w4_sm90.FP4_MASKS[1]) if fp4 else (0x000E000F, gemm_w4_sm90.BF16_BIAS)
    a_bad, _ = _emulated_step(words, s, z, fp4, masks=wrong)
    with pytest.raises(AssertionError):
        assert_close_to_scale((x[:, phys] * x_scale) @ a_bad.T, expected, 1e-2)
