"""4-bit weights decoded into fp16 pairs and multiplied by packed half-precision FMAs (kernels/gemv_w4.py FP4_HALF2,
TRITONLLM_W4_HALF2=1): MXFP4 and int4 through the word GEMV, MXFP4 through the MoE GEMV, against x @ dequant(w).T
and the MoE reference, in the interpreter's build (FP4_HALF2_EMULATED: the same decode, scaling and chaining, the
packed instructions emulated by Triton operations). Products are rounded to fp16 inside chunks of up to 16 a
lane, so the tolerance is fp16's (a few 1e-4 of the output's scale for MXFP4; int4, whose zero points are
subtracted from sum q a in float32, 1e-3 and up to 4e-3 when the activations share a sign), not float32's; rows
of every magnitude (fp16's range is held by a per-row power of two) keep it. The sm90 builds (PTX fma.rn.f16x2,
cvt.rn.f16x2.f32) are compiled and counted by test_half2_builds_for_sm90_with_fewer_instructions; their numerics
are GPU tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
from closeness import assert_close_to_scale  # this folder (pytest puts it on sys.path)
from launch_spy import LaunchSpy  # tests/
from seeded import randn as _randn  # this folder

from tritonllm import platform
from tritonllm.kernels import gemm as g
from tritonllm.kernels import gemm_w4_tma_sm90, gemv_w4, gemv_w4_sm90, moe_gemv_sm90, reference
from tritonllm.kernels import moe as moe_module
from tritonllm.kernels.moe import fused_moe
from tritonllm.kernels.moe_tiles import MoeTiles
from tritonllm.kernels.quant_formats import E2M1_VALUES, FP4, INT4, QuantizedWeight, QuantScheme, pack_int4
from tritonllm.quantization.quantize import quantize_experts, quantize_weight

ROOT = Path(__file__).resolve().parents[2]
DTYPE = platform.DEFAULT_DTYPE
SCHEME = QuantScheme(FP4, "mx", "none")
SCHEMES = [
    SCHEME,
    QuantScheme(INT4, "group", "none", group_size=32),
    QuantScheme(INT4, "group", "none", group_size=128),
]
# fp16 chains of 16 products: measured 3-9e-4 of the output's scale for MXFP4, 0.8-2.2e-3 for int4 (2.4-4.2e-3
# with activations of mean 1: the zero points' term cancels much of sum q a) in float32 (bf16: its own rounding,
# 1e-2 and 2e-2); float32's decode gives ~2e-7
TOL = 3e-3 if DTYPE != torch.bfloat16 else 2e-2
INT4_TOL = 6e-3 if DTYPE != torch.bfloat16 else 2e-2
MODE = gemv_w4.FP4_HALF2 if platform.is_gpu() else gemv_w4.FP4_HALF2_EMULATED


needs_sm90 = pytest.mark.skipif(
    not (platform.is_gpu() and gemv_w4_sm90.available()), reason="the Gluon GEMVs run on sm90 GPUs only"
)


@pytest.fixture
def half2(monkeypatch) -> None:
    if platform.PLATFORM == "rocm":
        pytest.skip("FP4_HALF2 is NVIDIA's (and the interpreter's)")
    monkeypatch.setattr(g, "FP4_BITS", MODE)
    monkeypatch.setattr(moe_module, "FP4_BITS", MODE)
    monkeypatch.setattr(gemv_w4, "FP4_BITS", MODE)  # the Gluon kernels' switch (gemv_w4_sm90.half2_on)


def _gemv(x, weight, block_k, split_k, block_n=16, block_m=1):
    tiles = g.GemmTiles(block_m, block_n, block_k, 4, 2, 1, 1, gemv=True)
    return g.gemm(x, weight.data, None, b_scale=weight.scale, b_zero=weight.zeros, tiles=tiles, split_k=split_k,
                  **g.scale_args(weight.scheme))  # fmt: skip


def _weight(n: int, k: int, scheme: QuantScheme, seed: int = 32):
    """A quantized random weight; int4's zero points made fractional (GGUF's Q4_1 and K-quants carry such)."""
    weight = quantize_weight(_randn(n, k, seed=seed), scheme)
    if weight.zeros is not None:
        frac = torch.rand(weight.zeros.shape, generator=torch.Generator().manual_seed(seed))
        weight.zeros += (0.3 * frac).to(weight.zeros.device, weight.zeros.dtype)
    return weight


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: f"{s.format_name}-g{s.group_size}")
@pytest.mark.parametrize(
    "m, n, k, block_k, split_k",
    [(1, 130, 384, 16, 1), (1, 130, 384, 64, 1), (3, 45, 640, 64, 1), (2, 20, 1152, 64, 1), (3, 45, 640, 128, 3),
     (2, 20, 1152, 128, 3)],
)  # fmt: skip
def test_word_gemv_in_half_pairs_matches_the_dequantized_weight(scheme, m, n, k, block_k, split_k, half2) -> None:
    """Tiles whose groups or chunks hold 2 (16 columns) or 4 words (64, 128; int4's 128-column group in chunks
    of 4); K splits (each its own row factor); ragged N and K tails; several rows; int4 with fractional zero
    points, and activations of mean 1."""
    weight = _weight(n, k, scheme)
    for shift in (0.0, 1.0) if scheme.format_name != SCHEME.format_name else (0.0,):
        x = _randn(m, k, seed=30, dtype=DTYPE) + shift
        expected = x.float() @ reference.dequantize_weight(weight).T
        tol = TOL if scheme is SCHEME else INT4_TOL
        assert_close_to_scale(_gemv(x, weight, block_k, split_k), expected, tol)


@pytest.mark.parametrize("scheme", SCHEMES[:2], ids=lambda s: s.format_name)
@pytest.mark.parametrize("block_m", [1, 4])
def test_rows_of_every_magnitude_keep_their_precision(scheme, block_m, half2) -> None:
    """Each row is scaled into fp16's range by its own power of two: a row past fp16's range (1e5, one value at
    3e6), one at 1e-30, an all-zero row and a row whose tail is 1e-6 of its head each match their own reference
    to the fp16 chain's precision, and nothing overflows."""
    k, n = 640, 40
    x = _randn(5, k, seed=30, dtype=torch.float32)
    x[0] *= 1e5
    x[0, 3] = 3e6
    x[1] *= 1e-30
    x[2] = 0
    x[3, 100:] *= 1e-6
    x = x.to(DTYPE)  # float32 or bfloat16: both hold 1e-30 and 3e6 (float16 would not)
    weight = _weight(n, k, scheme)
    got = _gemv(x, weight, 128, 2, block_m=block_m).float()
    expected = x.float() @ reference.dequantize_weight(weight).T
    assert torch.isfinite(got).all()
    assert torch.count_nonzero(got[2]) == 0
    for r in (0, 1, 3, 4):
        assert_close_to_scale(got[r], expected[r], TOL if scheme is SCHEME else INT4_TOL)


def _moe_problem(t: int, e: int, h: int, i: int, top_k: int, seed: int) -> tuple[tuple, dict]:
    weights, ids = reference.moe_route(_randn(t, e, seed=seed, dtype=torch.float32), top_k, True)
    w13 = quantize_experts(_randn(e, 2 * i, h, seed=seed + 2) * h**-0.5, SCHEME)
    w2 = quantize_experts(_randn(e, h, i, seed=seed + 3) * i**-0.5, SCHEME)
    kwargs = dict(activation="swiglu_oai", w13_bias=_randn(e, 2 * i, seed=seed + 4, dtype=DTYPE),
                  w2_bias=_randn(e, h, seed=seed + 5, dtype=DTYPE))  # fmt: skip
    return (4 * _randn(t, h, seed=seed + 1, dtype=DTYPE), w13, w2, weights, ids), kwargs


def test_gpt_oss_activation_bound_holds_and_sets_the_factor() -> None:
    """w2's rows after gpt-oss's clamped activation are bounded (moe_epilogue.activation_bound), so its half-pair
    GEMV takes the factor from the bound instead of a pass over the rows: the bound holds over gate and up from
    -1e4 to 1e4 (tight within 2%), silu has none, and the bound's exponent field keeps every row below 2**15."""
    from tritonllm.kernels.moe_epilogue import activation_bound

    v = torch.cat([torch.linspace(-1e4, 1e4, 201), torch.linspace(-10, 10, 1001)]).double()
    gate_up = torch.cat([v.repeat_interleave(len(v))[:, None], v.repeat(len(v))[:, None]], dim=1)
    for alpha, limit in ((1.702, 7.0), (1.0, 3.0), (4.0, 0.5)):
        worst = reference.moe_activation(gate_up.double(), "swiglu_oai", alpha, limit).abs().max().item()
        bound = activation_bound("swiglu_oai", alpha, limit)
        assert worst <= bound <= 1.02 * worst, (alpha, limit, worst, bound)
        e = gemv_w4.half2_bound_exp(bound)
        factor = 2.0 ** (gemv_w4.HALF2_EXP_BIAS.value - e)
        assert bound * factor < 2**15 <= 2 * bound * factor
    assert activation_bound("silu", 1.702, 7.0) == 0.0 and activation_bound("swiglu_oai", 1.702, 0.0) == 0.0
    assert gemv_w4.half2_bound_exp(0.0) == 0 and gemv_w4.half2_bound_exp(float("inf")) == 0
    assert gemv_w4.half2_bound_exp(2.0**11) == 0  # too loose a bound: the pass


def test_w2_takes_the_bound_and_holds_saturated_activations(half2, monkeypatch) -> None:
    """gpt-oss's w2 GEMV in half pairs reads its factor from the activation's bound (A_EXP, no pass over the rows),
    and stays within fp16's precision both for activations at the bound (inputs large enough that gate and up
    clamp) and for small ones (the bound then leaves them far below 2**15); a w2 whose A_EXP were too small
    (the bound wrongly 1) overflows fp16 and is caught."""
    spy = LaunchSpy.install(monkeypatch, moe_module, "moe_gemv_kernel")
    t = g.GemmTiles(1, 64, 64, 1, 1, 1, gemv=True)  # 64 columns: few interpreter programs
    tiles = MoeTiles(t, t, joint=True, sum_slots=True)
    for scale in (200.0, 0.05):
        args, kwargs = _moe_problem(2, 5, 64, 96, 2, seed=60)
        args = (args[0] * scale, *args[1:])
        got = fused_moe(*args, tiles=tiles, **kwargs)
        assert_close_to_scale(got, reference.fused_moe(*args, **kwargs), TOL)
    assert [c["A_EXP"] for c in spy.calls] == [0, 132] * 2  # w13 takes the pass, w2 the bound (57: 2**5 <= 57 < 2**6)
    monkeypatch.setattr(moe_module, "activation_bound", lambda *a: 1.0)
    args, kwargs = _moe_problem(2, 5, 64, 96, 2, seed=60)
    args = (args[0] * 200.0, *args[1:])
    with pytest.raises(AssertionError):
        assert_close_to_scale(fused_moe(*args, tiles=tiles, **kwargs), reference.fused_moe(*args, **kwargs), TOL)


@pytest.mark.parametrize(
    "loads, flags, i",
    [
        (0, {}, 96),
        (1, {}, 64),
        (1, dict(joint=True, sum_slots=True), 96),
        (1, dict(joint=True, sum_slots=True), 160),
        (2, dict(joint=True, sum_slots=True), 64),
    ],
    ids=[
        "loads0-ragged_k",
        "loads1-even_k",
        "loads1-joint_slots-ragged_k",
        "loads1-joint_slots-ragged_k_three_steps",
        "loads2-joint_slots-even_k",
    ],
)
def test_moe_gemv_in_half_pairs_matches_reference(loads, flags, i, half2, monkeypatch) -> None:
    """The MoE GEMV's MXFP4 experts (w13 gated, w2 per pair or summing the slots) under each load schedule (w2's
    EARLY loads, on by default, under 1 and 2 with the slots: step 0's words before the rows' scale pass), over
    several 32-column K steps, K even over them or ragged (96 on 64: w2's last step masked; 160 on 64: step 0,
    a whole step, then a partial one)."""
    from tritonllm.kernels import moe_tiles

    monkeypatch.setenv("TRITONLLM_MOE_GEMV_LOADS", str(loads))
    moe_tiles.gemv_loads.cache_clear()
    try:
        args, kwargs = _moe_problem(2, 5, 64, i, 2, seed=50)
        t = g.GemmTiles(1, 16, 32 if i == 64 else 64, 1, 1, 1, gemv=True)
        tiles = MoeTiles(t, t, **flags)
        got = fused_moe(*args, tiles=tiles, **kwargs)
        assert_close_to_scale(got, reference.fused_moe(*args, **kwargs), TOL)
    finally:
        moe_tiles.gemv_loads.cache_clear()


def _swap_pairs(a, b, ASM):
    return gemv_w4._as_half2(b, a)  # each activation pair the other way round: (j + 4, j)


def test_a_wrong_pairing_is_caught(half2, monkeypatch) -> None:
    """Activations packed against the wrong nibble of each pair fail the tolerance by far."""
    monkeypatch.setitem(gemv_w4._chunk_dot_half2.fn.__globals__, "_pack_half2", triton.jit(_swap_pairs))
    x = _randn(2, 384, seed=30, dtype=DTYPE)
    weight = quantize_weight(_randn(70, 384, seed=32), SCHEME)
    expected = x.float() @ reference.dequantize_weight(weight).T
    with pytest.raises(AssertionError):
        assert_close_to_scale(_gemv(x, weight, 64, 1), expected, 0.1)


def test_the_mode_follows_the_platform_and_the_switch(monkeypatch) -> None:
    monkeypatch.delenv("TRITONLLM_W4_HALF2", raising=False)
    assert gemv_w4.fp4_mode() == (gemv_w4.FP4_EXACT if platform.PLATFORM == "rocm" else gemv_w4.FP4_F32)
    monkeypatch.setenv("TRITONLLM_W4_HALF2", "1")
    expected = {"rocm": gemv_w4.FP4_EXACT, "cuda": gemv_w4.FP4_HALF2, "cpu": gemv_w4.FP4_HALF2_EMULATED}
    assert gemv_w4.fp4_mode() == expected[platform.PLATFORM]
    monkeypatch.setenv("TRITONLLM_W4_HALF2", "yes")
    with pytest.raises(ValueError, match="TRITONLLM_W4_HALF2='yes'"):
        gemv_w4.fp4_mode()
    # the Gluon kernels read the switch at each launch, and probe their compile once a process (a misplaced cache
    # decorator once swapped the two: a compile probe every launch, a switch read once)
    for mode in (gemv_w4.FP4_HALF2, gemv_w4.FP4_F32):
        monkeypatch.setattr(gemv_w4, "FP4_BITS", mode)
        assert gemv_w4_sm90.half2_on() == (mode == gemv_w4.FP4_HALF2)
    assert hasattr(gemv_w4_sm90.available, "cache_info") and hasattr(moe_gemv_sm90.available, "cache_info")


# ---- the Gluon GEMVs (sm90): the dense one (Llama's 4-bit layers at M = 1) and the MoE one (opt-in) -----------


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: f"{s.format_name}-g{s.group_size}")
@pytest.mark.parametrize("n, k", [(45, 640), (130, 4096), (77, 4224), (9, 8192 + 128)])
@pytest.mark.parametrize(
    "tiling", [None, "8:4:0:0", "4:1:1:0", "16:4:0:0"], ids=["default", "8x4", "4x1_prefetch", "16x4"]
)
def test_gluon_gemv_in_half_pairs_matches_the_dequantized_weight(scheme, n, k, tiling, half2, monkeypatch) -> None:
    """K below, at and above the 4096-column tile (masked groups), ragged N, a bias, each tiling the sweep
    tries; rows of every magnitude; int4 with fractional zero points and activations of mean 1."""
    monkeypatch.setattr(gemm_w4_tma_sm90, "FORCE", "never")  # the TMA kernel would take these shapes first
    if tiling:
        t = gemv_w4_sm90.Tiling.parse(tiling)
        monkeypatch.setattr(gemv_w4_sm90, "TILINGS", {"int4": t, "fp4": t})
    assert gemv_w4_sm90.available()  # its compile probe (cached) before the spy replaces the kernel
    spy = LaunchSpy.install(monkeypatch, gemv_w4_sm90, "w4_gemv_sm90_kernel")
    weight = _weight(n, k, scheme, seed=52)
    bias = _randn(n, seed=51, dtype=torch.bfloat16)
    cases = [(50, 1.0, 0.0), (53, 1e5, 0.0), (54, 1e-30, 0.0), (55, 1.0, 1.0)]
    for seed, factor, shift in cases:
        x = ((_randn(1, k, seed=seed) + shift) * factor).bfloat16()
        got = g.gemm(x, weight.data, bias * factor, b_scale=weight.scale, b_zero=weight.zeros, sm90="always",
                     **g.scale_args(scheme))  # fmt: skip
        expected = x.float() @ reference.dequantize_weight(weight).T + bias.float() * factor
        assert_close_to_scale(got, expected, 2e-2)
    assert spy.launches == len(cases) and gemv_w4_sm90.half2_on(), "the Gluon GEMV did not run in half pairs"


@pytest.mark.gpu
@needs_sm90
def test_gluon_gemv_in_half_pairs_decodes_every_code_exactly(half2, monkeypatch) -> None:
    """Every e2m1 code under scales 2**-27 .. 2**23, picked out column by column with one-hot activations (the row
    factor 2**14: each product exact in fp16): exact."""
    monkeypatch.setattr(gemm_w4_tma_sm90, "FORCE", "never")
    codes = torch.arange(16, dtype=torch.uint8).repeat(3, 8)  # [3, 128]
    exps = torch.tensor([[127, 120, 100, 150], [130, 127, 104, 140], [127, 126, 101, 127]], dtype=torch.uint8)
    fp4 = QuantizedWeight(SCHEME, pack_int4(codes).to(platform.DEVICE), exps.to(platform.DEVICE))
    eye = torch.eye(128, device=platform.DEVICE, dtype=torch.bfloat16)
    got = torch.stack([g.gemm(eye[i : i + 1], fp4.data, None, b_scale=fp4.scale, sm90="always",
                              **g.scale_args(SCHEME))[0] for i in range(128)], 1).float().cpu()  # fmt: skip
    values = torch.tensor(E2M1_VALUES).repeat(3, 8) * torch.exp2(exps.float() - 127).repeat_interleave(32, 1)
    assert torch.equal(got, values.bfloat16().float())


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("gluon", [False, True], ids=["triton_moe_gemv", "gluon_moe_gemv"])
@pytest.mark.parametrize("t, e, h, i, top_k", [(1, 32, 2880, 2880, 4), (3, 8, 2880, 2880, 4), (4, 5, 96, 4160, 3)])
def test_moe_gemv_in_half_pairs_on_the_gpu(gluon, t, e, h, i, top_k, half2, monkeypatch) -> None:
    """gpt-oss's shape (K = 2880: rows of 360 words), several tokens, K beyond one Gluon K tile: the Triton MoE
    GEMV (joint + summed slots, its defaults) and the opt-in Gluon one, both in half pairs."""
    monkeypatch.setenv("TRITONLLM_MOE_GEMV_GLUON", "1" if gluon else "0")
    assert moe_gemv_sm90.available()  # its compile probe (cached) before the spy replaces the kernel
    spy = LaunchSpy.install(monkeypatch, moe_gemv_sm90, "moe_w4_gemv_sm90_kernel")
    args, kwargs = _moe_problem(t, e, h, i, top_k, seed=71 + t)
    args = (args[0].bfloat16(), *args[1:])
    kwargs = {k: v.bfloat16() if torch.is_tensor(v) else v for k, v in kwargs.items()}
    tiles = MoeTiles(*[g.GemmTiles(1, 16, 512, 4, 2, 1, gemv=True)] * 2, joint=not gluon, sum_slots=not gluon)
    assert_close_to_scale(fused_moe(*args, tiles=tiles, **kwargs), reference.fused_moe(*args, **kwargs), 2e-2)
    assert spy.launches == (2 if gluon else 0)


@pytest.mark.parametrize(
    "launch, fewer",
    [(["--fp4", "--moe", "w13-joint", "--block-n", "8"], 0.9), (["--fp4", "--moe", "w2-slots", "--block-n", "16"], 0.9),
     (["--fp4", "--block-n", "16"], 0.9), (["--block-n", "16"], 0.9), (["--fp4", "--gluon"], 0.9),
     (["--gluon"], 0.9), (["--gluon", "--one-tile"], 0.9)],
    ids=["w13_joint", "w2_slots", "dense_mxfp4", "dense_int4", "gluon_mxfp4", "gluon_int4", "gluon_int4_one_tile"],
)  # fmt: skip
def test_half2_builds_for_sm90_with_fewer_instructions(launch, fewer) -> None:
    """The sm90 build (PTX packed FMAs and conversions) compiles without spills, and its K loop takes fewer
    instructions than the float32 decode's (Triton 3.6, the GPU image's, a K step: gpt-oss's MoE tiles w13
    695 -> 490, w2 715 -> 505; the portable word GEMV MXFP4 638 -> 481, int4 709 -> 413; the Gluon GEMV at the
    H200's tilings MXFP4 1,166 -> 713, int4 548 -> 373). MXFP4: a word's odd and even nibbles each moved into
    bytes as fp16 high bytes, then four pairs by a mask or a byte permute; int4: each thread's run of four words
    chained in fp16."""
    if "--gluon" in launch and not gemv_w4_sm90.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    common = [sys.executable, "scripts/sass_loop_mix.py", *launch]
    if "--gluon" not in launch:
        common += ["--block-w", "128"]
    if "--moe" in launch:
        common += ["--loads", "1", "--ragged-k", "--aligned-rows"]
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    counts = []
    for extra in ([], ["--half2"]):
        out = subprocess.run(common + extra, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "no spills" in out.stdout, out.stdout
        counts.append(int(out.stdout.split("loop: ")[1].split()[0]))
        if extra:
            assert "HFMA2" in out.stdout and "F2FP" in out.stdout, out.stdout
    assert counts[1] < fewer * counts[0], counts
