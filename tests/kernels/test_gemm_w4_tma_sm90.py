"""The Hopper W4 GEMM with the weight streamed by TMA (Gluon, kernels/gemm_w4_tma_sm90.py) against
x @ dequant(w).T at M = 1..64, its plans, its transposed scales and its sm90 build. The kernel needs an
sm90 GPU (no interpreter runs Gluon): its numerics are GPU tests; on the CPU it must compile for sm90,
build its scales as the decode rounds them and stay out of gemm()'s way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import w4_checks as w4  # this folder
from closeness import assert_close_to_scale  # this folder (pytest puts it on sys.path)
from launch_spy import LaunchSpy  # tests/
from seeded import randn as _randn  # this folder

from tritonllm import platform
from tritonllm.kernels import gemm_w4_sm90, reference
from tritonllm.kernels import gemm_w4_tma_sm90 as tma
from tritonllm.quantization.quantize import quantize_weight

needs_sm90 = pytest.mark.skipif(
    not (platform.is_gpu() and tma.available()), reason="the TMA W4 GEMM runs on sm90 GPUs only"
)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def spy(monkeypatch) -> LaunchSpy:
    """Counts the kernel's launches; gemm() takes it wherever it serves the shape."""
    spy = LaunchSpy.install(monkeypatch, tma, "w4_tma_gemm_sm90_kernel")
    monkeypatch.setattr(tma, "FORCE", "always")
    return spy


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("m", [1, 2, 5, 16, 17, 33, 64])
@pytest.mark.parametrize("n, k", [(48, 256), (208, 4224), (1008, 1024)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_matches_the_dequantized_weight(group, m, n, k, dtype, spy) -> None:
    """Ragged M (rows past M read as TMA's zero fill) and N (a last tile past N), K of 2 to 33 steps, both
    group sizes, both 16-bit dtypes, with the bias, one split or the plan's K splits."""
    w4.check_against_dequantized(m, n, k, w4.int4_scheme(group), dtype, seed=70)
    assert spy.launches == 1, "the TMA W4 GEMM did not run"


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m", [1, 17, 64])
@pytest.mark.parametrize("n, k", [(48, 256), (208, 4224)])
@pytest.mark.parametrize("plan", [None, "64:3:4", "128:1:6:8"])
def test_mxfp4_matches_the_dequantized_weight(m, n, k, plan, monkeypatch, spy) -> None:
    """MXFP4 (e2m1, e8m0 per 32; bf16 activations), with the bias, K splits and two warpgroups."""
    if plan:
        monkeypatch.setattr(tma, "PLAN_OVERRIDE", tma.Plan.parse(plan))
    w4.check_against_dequantized(m, n, k, w4.MXFP4, torch.bfloat16, seed=80)
    assert spy.launches == 1


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("plan", ["128:1:8", "128:3:2", "64:2:12", "64:5:3", "128:2:4:8", "128:3:3:8"])
@pytest.mark.parametrize("m", [1, 24, 64])
def test_every_plan_matches(plan, m, monkeypatch, spy) -> None:
    """Rows a program, K splits (uneven: the last split shorter; summed in the kernel, the same bits on a
    second call, the counters back at zero), 2 to 12 stages (more stages than a split's steps too), two
    warpgroups, at K = 4,224 and 4,096."""
    p = tma.Plan.parse(plan)
    if tma.smem_bytes(p, tma.block_m(m), False, 128) > 227 * 1024:
        pytest.skip("more shared memory than an SM has")
    monkeypatch.setattr(tma, "PLAN_OVERRIDE", p)
    w4.check_plan(m, 208, seed=73)
    assert spy.launches == 4


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("group", [32, 128])
def test_every_code_decodes_exactly(group, spy) -> None:
    """Every int4 code under zero points and power-of-two scales, picked out column by column with one-hot
    activations (all 128 columns of a K step: the column permutation): exact."""
    w4.check_every_int4_code(group)
    assert spy.launches == 8


@pytest.mark.gpu
@needs_sm90
def test_every_e2m1_code_decodes_exactly(spy) -> None:
    """Every e2m1 code (the subnormal 0.5 too) under scales 2**-27 .. 2**23, one-hot activations: exact."""
    w4.check_every_e2m1_code()
    assert spy.launches == 8


@pytest.mark.gpu
@needs_sm90
def test_a_broken_decode_is_caught(monkeypatch, spy) -> None:
    """Negative check: with the nibble mask shifted the kernel's output fails the same comparison."""
    w4.check_broken_mask_caught(tma, monkeypatch)
    assert spy.launches == 2


def test_gemm_leaves_it_alone_off_hopper(spy) -> None:
    """Without an sm90 GPU (here: the interpreter) gemm() at M = 1..64 runs the portable kernels."""
    if platform.is_gpu() and tma.available():
        pytest.skip("an sm90 GPU: the kernel is meant to run here")
    weight = quantize_weight(_randn(16, 256, seed=78), w4.int4_scheme(32))
    x = _randn(3, 256, seed=79, dtype=platform.DEFAULT_DTYPE)
    assert_close_to_scale(w4.w4_gemm(x, weight), x.float() @ reference.dequantize_weight(weight).T, 1e-2)
    assert spy.launches == 0


def test_kernel_scales_round_as_the_decode_does() -> None:
    """int4: (s, -z s) in the activations' dtype, s rounded first, then z times s (gemm_w4_sm90's decode);
    transposed [K / group, N]; built once per dtype. MXFP4: the e8m0 bytes transposed."""
    weight = quantize_weight(_randn(48, 512, seed=84), w4.int4_scheme(128))
    for dtype in (torch.bfloat16, torch.float16):
        packed = tma.kernel_scales(weight.scale, weight.zeros, dtype, fp4=False)
        assert packed.shape == (4, 48) and packed.dtype == torch.int32 and packed.is_contiguous()
        s = (packed & 0xFFFF).to(torch.int16).view(dtype).T
        zs = (packed >> 16).to(torch.int16).view(dtype).T
        assert torch.equal(s, weight.scale.to(dtype))
        assert torch.equal(zs, -(weight.zeros.to(dtype) * weight.scale.to(dtype)))
        assert tma.kernel_scales(weight.scale, weight.zeros, dtype, fp4=False) is packed  # kept
    fp4 = quantize_weight(_randn(48, 512, seed=85), w4.MXFP4)
    assert torch.equal(tma.kernel_scales(fp4.scale, None, torch.bfloat16, fp4=True), fp4.scale.T)
    one = quantize_weight(_randn(16, 128, seed=86), w4.int4_scheme(128))  # one group: still row-major strides (TMA's)
    assert tma.kernel_scales(one.scale, one.zeros, torch.bfloat16, fp4=False).stride() == (16, 1)


def test_supported_shapes_and_plans() -> None:
    supported = tma.supported
    assert supported(1, 4096, 4096, 128) == supported(64, 6144, 4096, 32) == tma.HAVE_GLUON
    assert not supported(65, 4096, 4096, 128)  # beyond the skinny buckets
    assert not supported(16, 4096, 4160, 32)  # K not whole 128-column steps
    assert not supported(16, 4096, 4096, 64)  # groups of 64: gemm_w4_sm90
    assert not supported(16, 4100, 4096, 128)  # N not a multiple of 16: the scales' rows are not TMA boxes
    assert [tma.block_m(m) for m in (1, 8, 9, 16, 17, 64)] == [8, 8, 16, 16, 32, 64]
    assert tma.Plan.parse("64:3") == tma.Plan(64, 3) and tma.Plan.parse("128:2:4:8") == tma.Plan(128, 2, 4, 8)
    with pytest.raises(ValueError, match="64 weight rows a warpgroup"):
        tma.Plan.parse("64:1:2:8")  # two warpgroups need 128 rows
    for m in (1, 16, 32, 64):
        for n, k in ((6144, 4096), (28672, 4096), (4096, 14336)):
            p = tma.plan(m, n, k)
            assert 2 <= p.stages <= 8 and tma.smem_bytes(p, tma.block_m(m), False, 128) <= tma.SMEM_PER_PROGRAM
            assert p.split == 1 or k // p.split >= 4 * tma.BLOCK_K


_COMPILE = """
from tritonllm.kernels import gemm_w4_tma_sm90 as t
for kw in (dict(), dict(fp4=True, group_k=32), dict(group_k=32, bm=16, split=2), dict(fp16=True, bm=64, block_n=64,
           stages=3), dict(warps=8, bm=32, stages=6)):
    ptx = t.compile_sm90(**kw).asm["ptx"]
    print("cp.async.bulk.tensor" in ptx, "mbarrier.try_wait" in ptx, "wgmma.mma_async" in ptx, ".local" in ptx)
"""


@pytest.mark.skipif(not tma.HAVE_GLUON, reason="this Triton has no Gluon")
def test_compiles_for_sm90_without_spills() -> None:
    """int4 (groups of 128 and 32, bf16 and fp16, split, two warpgroups) and MXFP4 compile for sm90 (a
    subprocess: this one runs the interpreter) with TMA copies, mbarrier waits and the warpgroup MMA in
    the PTX, and no local memory (spills)."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, "-c", _COMPILE], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:5] == ["True True True False"] * 5, result.stdout


def test_taken_only_when_forced(monkeypatch) -> None:
    """Measured slower in the engine than the pointer-loading kernels (session 19): gemm() takes it only
    with FORCE=always; the plan gives wide layers (gate_up) 128-row programs, the others 64 rows and K splits."""
    monkeypatch.setattr(tma, "FORCE", "")
    monkeypatch.setattr(platform, "num_multiprocessors", lambda: 132)
    assert not any(tma.measured_faster(m, 28672, 4096) for m in (1, 2, 16, 64))
    monkeypatch.setattr(tma, "FORCE", "always")
    assert tma.measured_faster(16, 28672, 4096)
    assert tma.plan(16, 28672, 4096) == tma.Plan(128, 1, 4)
    assert tma.plan(16, 4096, 14336) == tma.Plan(64, 4, 4)


def test_the_pointer_kernels_take_what_it_declines() -> None:
    """Groups of 64 go to gemm_w4_sm90 (which serves them) and not here."""
    assert gemm_w4_sm90.supported(16, 4096, 64) == gemm_w4_sm90.HAVE_GLUON
    assert not tma.supported(16, 4096, 4096, 64)
