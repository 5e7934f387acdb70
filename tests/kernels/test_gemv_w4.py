"""The 4-bit word GEMV (kernels/gemv_w4.py): int4 with group scales and zero points, MXFP4, against
x @ dequant(w).T at ragged shapes, through gemm() with GEMV tiles."""

from __future__ import annotations

import pytest
import torch
from closeness import assert_close_to_scale  # this folder (pytest puts it on sys.path)
from launch_spy import LaunchSpy  # tests/
from seeded import randn as _randn  # this folder
from w4_schemes import SCHEMES, scheme_id  # this folder

from tritonllm import platform
from tritonllm.kernels import gemm as g
from tritonllm.kernels import gemv_w4, reference
from tritonllm.kernels.quant_formats import E2M1_VALUES, FP4, INT4, QuantizedWeight, QuantScheme, pack_int4
from tritonllm.quantization.quantize import quantize_weight

DEVICE = platform.DEVICE
MODEL_DTYPE = platform.DEFAULT_DTYPE
TOL = 1e-5 if MODEL_DTYPE == torch.float32 else 1e-2


@pytest.fixture
def spy(monkeypatch) -> LaunchSpy:
    return LaunchSpy.install(monkeypatch, g, "w4_gemv_kernel")


def _gemv(x, weight, bias, block_k, split_k, block_n=32, block_m=1):
    tiles = g.GemmTiles(block_m, block_n, block_k, 4, 2, 1, 1, gemv=True)
    return g.gemm(x, weight.data, bias, b_scale=weight.scale, b_zero=weight.zeros, tiles=tiles, split_k=split_k,
                  **g.scale_args(weight.scheme))  # fmt: skip


@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_id)
@pytest.mark.parametrize("m, n, k", [(1, 130, 384), (3, 45, 640), (2, 20, 1152)])
@pytest.mark.parametrize("block_k, split_k", [(64, 1), (256, 1), (128, 3)])
def test_word_gemv_matches_the_dequantized_weight(scheme, m, n, k, block_k, split_k, spy) -> None:
    """Tiles of one group, of several groups and inside one group; K not a multiple of the tile (a
    masked tail); K splits; ragged N; several rows."""
    group = scheme.group_size or 32
    if k % group:
        pytest.skip("K must be whole groups")
    x, bias = _randn(m, k, seed=30, dtype=MODEL_DTYPE), _randn(n, seed=31, dtype=MODEL_DTYPE)
    weight = quantize_weight(_randn(n, k, seed=32), scheme)
    got = _gemv(x, weight, bias, block_k, split_k)
    expected = x.float() @ reference.dequantize_weight(weight).T + bias.float()
    assert_close_to_scale(got, expected, TOL)
    assert spy.launches == 1, "the word GEMV did not run"


@pytest.mark.parametrize("scheme", SCHEMES[::2], ids=scheme_id)
@pytest.mark.parametrize("m, block_m", [(5, 4), (2, 4), (3, 2)])
@pytest.mark.parametrize("block_k, split_k", [(256, 1), (128, 3)])
def test_several_rows_a_program_share_the_decoded_tile(scheme, m, block_m, block_k, split_k, spy) -> None:
    """BLOCK_M rows a program (each weight tile decoded once for all of them): rows beyond M masked,
    several row blocks, K splits, a masked K tail (K 640 with 256-column tiles)."""
    n, k = 45, 640
    x, bias = _randn(m, k, seed=39, dtype=MODEL_DTYPE), _randn(n, seed=40, dtype=MODEL_DTYPE)
    weight = quantize_weight(_randn(n, k, seed=41), scheme)
    got = _gemv(x, weight, bias, block_k, split_k, block_m=block_m)
    assert_close_to_scale(got, x.float() @ reference.dequantize_weight(weight).T + bias.float(), TOL)
    assert spy.launches == 1


def test_word_gemv_with_one_group_over_all_of_k(spy) -> None:
    """One scale and zero point a row (GPTQ's group_size -1 is loaded as a group of all of K)."""
    scheme = QuantScheme(INT4, "group", "none", group_size=320)
    w = _randn(33, 320, seed=33)
    weight = quantize_weight(w, scheme)
    x = _randn(2, 320, seed=34, dtype=MODEL_DTYPE)
    tiles = g.GemmTiles(1, 16, 64, 4, 2, 1, 1, gemv=True)
    got = g.gemm(x, weight.data, b_scale=weight.scale, b_zero=weight.zeros, tiles=tiles, **g.scale_args(scheme))
    assert_close_to_scale(got, x.float() @ reference.dequantize_weight(weight).T, TOL)
    assert spy.launches == 1


@pytest.mark.parametrize("fp4_bits", [True, False])
def test_every_e2m1_code_decodes_exactly(fp4_bits, monkeypatch, spy) -> None:
    """All 16 codes (0 and the denormal-scaled 0.5 included) under scales from 2**-27 to 2**23, picked
    out column by column with an identity activation: exact, with the 2**-126 bit decode and with the
    where-based one that ROCm takes."""
    monkeypatch.setattr(g, "FP4_BITS", fp4_bits)
    codes = torch.arange(16, dtype=torch.uint8).repeat(6, 4)  # [6, 64]: two 32-groups a row
    exps = torch.tensor([[127, 120], [130, 127], [100, 150], [127, 127], [104, 140], [127, 126]], dtype=torch.uint8)
    weight = QuantizedWeight(QuantScheme(FP4, "mx", "none"), pack_int4(codes).to(DEVICE), exps.to(DEVICE))
    values = torch.tensor(E2M1_VALUES).repeat(6, 4) * torch.exp2(exps.float() - 127).repeat_interleave(32, 1)
    eye = torch.eye(64, device=DEVICE)
    tiles = g.GemmTiles(1, 8, 64, 4, 2, 1, 1, gemv=True)
    got = g.gemm(eye, weight.data, b_scale=weight.scale, tiles=tiles, **g.scale_args(weight.scheme)).T.cpu()
    assert torch.equal(got, values)
    assert spy.launches == 1


def test_int4_codes_and_zero_points_decode_exactly(spy) -> None:
    """Every int4 code with zero points 0, 8 and 15 and power-of-two scales: exact."""
    codes = torch.arange(16, dtype=torch.uint8).repeat(3, 4)  # [3, 64]
    scale = torch.tensor([[1.0], [0.5], [4.0]]).half()
    zeros = torch.tensor([[0.0], [8.0], [15.0]]).half()
    weight = QuantizedWeight(
        QuantScheme(INT4, "group", "none", group_size=64), pack_int4(codes).to(DEVICE), scale.to(DEVICE),
        zeros=zeros.to(DEVICE),
    )  # fmt: skip
    eye = torch.eye(64, device=DEVICE)
    tiles = g.GemmTiles(1, 4, 64, 4, 2, 1, 1, gemv=True)
    got = g.gemm(eye, weight.data, b_scale=weight.scale, b_zero=weight.zeros, tiles=tiles,
                 **g.scale_args(weight.scheme)).T.cpu()  # fmt: skip
    assert torch.equal(got, (codes.float() - zeros.float()) * scale.float())
    assert spy.launches == 1


def test_swapped_nibbles_are_caught(spy) -> None:
    """Negative check: the same bytes with their nibbles swapped (the odd column read as the even
    one) must fail the comparison."""
    scheme = SCHEMES[2]
    weight = quantize_weight(_randn(40, 256, seed=35), scheme)
    x = _randn(1, 256, seed=36, dtype=MODEL_DTYPE)
    expected = x.float() @ reference.dequantize_weight(weight).T
    swapped = QuantizedWeight(scheme, (weight.data >> 4) | (weight.data << 4), weight.scale, zeros=weight.zeros)
    with pytest.raises(AssertionError):
        assert_close_to_scale(_gemv(x, swapped, None, 128, 1), expected, TOL)


def test_weights_that_are_not_whole_words_take_the_byte_gemv(spy) -> None:
    """A packed weight at an odd byte offset cannot be viewed as int32: the byte GEMV serves it."""
    scheme = SCHEMES[3]
    weight = quantize_weight(_randn(24, 128, seed=37), scheme)
    shifted = torch.empty(weight.data.numel() + 1, dtype=torch.uint8, device=DEVICE)[1:].view_as(weight.data)
    shifted.copy_(weight.data)
    assert gemv_w4.as_words(shifted) is None
    moved = QuantizedWeight(scheme, shifted, weight.scale)
    x = _randn(1, 128, seed=38, dtype=MODEL_DTYPE)
    assert_close_to_scale(_gemv(x, moved, None, 64, 1), x.float() @ reference.dequantize_weight(weight).T, TOL)
    assert spy.launches == 0
