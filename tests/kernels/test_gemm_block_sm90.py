"""The Hopper block-FP8 GEMM (Gluon, kernels/gemm_block_sm90.py) against float32 of its dequantized
operands at prefill sizes: 128 x 128 weight blocks, 1 x 128 activation groups. Gluon needs an sm90 GPU
(no interpreter runs it): the numerics are GPU tests; on the CPU the kernel must compile for sm90 with
its MMAs overlapped (not serialized by ptxas) and stay out of gemm()'s way."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch
from closeness import assert_close_to_scale  # this folder (pytest puts it on sys.path)
from launch_spy import LaunchSpy  # tests/
from seeded import randn  # this folder

from tritonllm import platform
from tritonllm.kernels import gemm as g
from tritonllm.kernels import gemm_block_sm90 as blk
from tritonllm.kernels import reference
from tritonllm.kernels.quant_formats import QuantScheme
from tritonllm.quantization.quantize import quantize_weight

needs_sm90 = pytest.mark.skipif(
    not (platform.is_gpu() and blk.available()), reason="the Gluon block-FP8 GEMM runs on sm90 GPUs only"
)
BLOCK_FP8 = QuantScheme(torch.float8_e4m3fn, "block", "group")


@pytest.fixture
def spy(monkeypatch) -> LaunchSpy:
    return LaunchSpy.install(monkeypatch, blk, "block_fp8_gemm_sm90_kernel")


def _operands(m: int, n: int, k: int, seed: int):
    """(FP8 activations, their 1 x 128 scales, the block-quantized weight, float32 of the dequantized product)."""
    x = randn(m, k, seed=seed, dtype=torch.bfloat16)
    weight = quantize_weight(randn(n, k, seed=seed + 1) * 0.05, BLOCK_FP8)
    a, a_scale = reference.quantize_activation(x, BLOCK_FP8)
    expected = reference.dequantize_activation(a, a_scale, BLOCK_FP8) @ reference.dequantize_weight(weight).t()
    return a, a_scale, weight, expected


def _gemm(a, a_scale, weight, bias=None, out_dtype=torch.bfloat16, sm90="always"):
    return g.gemm(a, weight.data, bias, out_dtype=out_dtype, a_scale=a_scale, b_scale=weight.scale, sm90=sm90,
                  **g.scale_args(BLOCK_FP8))  # fmt: skip


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("m", [65, 128, 200, 1031])
@pytest.mark.parametrize(
    "n, k",
    # K steps: 1 (one at a time), 3 (odd), 8 (one unrolled iteration), 33 (four and a remainder of one)
    [(130, 128), (1000, 384), (256, 1024), (4096, 4224)],
)
def test_matches_the_dequantized_operands(m, n, k, spy) -> None:
    """Ragged M (rows past M read as TMA's zeros, masked), N (a partial last weight block) and K step counts
    that exercise the unrolled loop, its remainder and both together."""
    a, a_scale, weight, expected = _operands(m, n, k, seed=m + n + k)
    assert_close_to_scale(_gemm(a, a_scale, weight), expected, 1e-2)
    assert spy.launches == 1, "the Gluon block-FP8 GEMM did not run"


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bias_and_output_dtype(out_dtype, spy) -> None:
    a, a_scale, weight, expected = _operands(300, 520, 1280, seed=7)
    bias = randn(520, seed=8, dtype=out_dtype)
    got = _gemm(a, a_scale, weight, bias, out_dtype=out_dtype)
    assert got.dtype == out_dtype
    assert_close_to_scale(got, expected + bias.float(), 1e-2)
    assert spy.launches == 1


@pytest.mark.gpu
@needs_sm90
def test_a_wrong_scale_is_caught(spy) -> None:
    """Negative check: one K group's activation scales doubled must break the comparison (each group's
    product is scaled on its own, so a kernel that reused one group's scale would be caught as well)."""
    a, a_scale, weight, expected = _operands(200, 384, 1024, seed=9)
    bad = a_scale.clone()
    bad[:, 3] *= 2
    with pytest.raises(AssertionError):
        assert_close_to_scale(_gemm(a, bad, weight), expected, 1e-2)


@pytest.mark.gpu
@needs_sm90
def test_faster_dispatch_and_the_portable_kernels_agree(spy) -> None:
    """`triton_sm90`'s choice (sm90="faster") and the portable kernels (sm90="never") give the same
    product within FP8 rounding of the float32 accumulation order."""
    a, a_scale, weight, expected = _operands(512, 768, 2048, seed=10)
    fast, portable = _gemm(a, a_scale, weight, sm90="faster"), _gemm(a, a_scale, weight, sm90="never")
    assert_close_to_scale(fast, expected, 1e-2)
    assert_close_to_scale(portable, expected, 1e-2)
    assert spy.launches == int(blk.measured_faster(512, 768, 2048))


def test_compiles_for_sm90_with_the_mmas_overlapped() -> None:
    """The kernel compiles for sm90 without a GPU, and ptxas keeps its MMAs asynchronous: in the main
    loop the next step's MMA is issued before the previous one is waited for (`DEPBAR.LE gsb0, 0x1`).
    A loop-carried copy of an in-flight product, or a fresh zero accumulator per MMA, made ptxas wait
    for every MMA (`DEPBAR.LE gsb0, 0x0` before each of them: 36 of them in an earlier version)."""
    if not blk.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    kernel = blk.compile_sm90()
    nvdisasm = Path(__import__("triton").__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    if not nvdisasm.exists():
        pytest.skip("no nvdisasm in this Triton")
    cubin = Path(__import__("tempfile").mkdtemp()) / "block.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    sass = subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    mmas = len(re.findall(r"GMMA\.64x128x32", sass))
    full_waits = sass.count("DEPBAR.LE gsb0, 0x0")
    assert mmas >= 4 * blk.UNROLL
    assert sass.count("DEPBAR.LE gsb0, 0x1") >= blk.UNROLL - 1
    assert full_waits <= 4, f"{full_waits} full waits for {mmas} MMA instructions: ptxas serialized them"


def test_cpu_gemm_never_takes_it() -> None:
    """Without an sm90 GPU, sm90="always" still runs the portable kernels (takes() is False)."""
    if platform.is_gpu():
        pytest.skip("CPU-only check")
    a, a_scale, weight, expected = _operands(70, 130, 256, seed=11)
    assert not blk.available()
    assert_close_to_scale(_gemm(a, a_scale, weight), expected, 1e-2)
