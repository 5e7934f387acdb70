"""GGUF block decoding (kernels/gguf_dequant.py) against gguf-py's own dequantize, on random blocks
(random bytes with valid fp16 scales) at ragged row counts and several blocks per row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from tritonllm.kernels import reference
from tritonllm.kernels.gguf_dequant import DECODED_TYPES, decode_gguf_planes, dequantize_gguf
from tritonllm.kernels.quant_formats import UINT8, QuantizedWeight, QuantScheme
from tritonllm.quantization.gguf import layer_quant_for

# byte offsets of each block's fp16 fields (d, dmin / m): random bytes there could be inf or NaN
HALF_FIELDS = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.Q2_K: (80, 82),
               Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}  # fmt: skip
TYPES = list(DECODED_TYPES)


def random_blocks(qtype: Q, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """uint8 [rows, cols / QK * TS]: random blocks whose fp16 scales are finite and small, and whose
    MXFP4 exponents stay in range."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for offset in HALF_FIELDS.get(qtype, ()):
        halves = (rng.standard_normal((rows, cols // block, 1)) * 0.05).astype(np.float16)
        raw[..., offset : offset + 2] = halves.view(np.uint8)
    if qtype == Q.MXFP4:
        raw[..., 0] = rng.integers(100, 140, size=(rows, cols // block))
    return raw.reshape(rows, -1)


def _cols(qtype: Q) -> int:
    """Three superblocks, or nine 32-blocks (a second, partial 256-column tile)."""
    block = GGML_QUANT_SIZES[qtype][0]
    return block * (3 if block == 256 else 9)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


@pytest.mark.parametrize("rows", [1, 37])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantized_blocks_match_gguf(qtype, rows) -> None:
    raw = random_blocks(qtype, rows, _cols(qtype), seed=rows)
    want = torch.from_numpy(dequantize(raw, qtype).copy())
    _close(dequantize_gguf(torch.from_numpy(raw), qtype, _cols(qtype), torch.float32), want)


def test_dequantized_blocks_are_written_in_the_requested_dtype() -> None:
    raw = random_blocks(Q.Q6_K, 5, 256)
    got = dequantize_gguf(torch.from_numpy(raw), Q.Q6_K, 256, torch.float16)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, torch.from_numpy(dequantize(raw, Q.Q6_K)).half())


def _decoded(raw: np.ndarray, qtype: Q, cols: int, scheme: QuantScheme) -> QuantizedWeight:
    rows = raw.shape[0]
    if scheme.weight_scale == "mx":
        data, scale, zeros = (
            torch.empty(rows, cols // 2, dtype=torch.uint8),
            torch.empty(rows, cols // 32, dtype=torch.uint8),
            None,
        )
        group = 32
    else:
        group = scheme.group_size
        data = torch.empty(rows, cols // 2 if scheme.packed else cols, dtype=torch.uint8)
        scale, zeros = torch.empty(rows, cols // group), torch.empty(rows, cols // group)
    decode_gguf_planes(torch.from_numpy(raw), qtype, cols, data, scale, zeros, group)
    return QuantizedWeight(scheme, data, scale, zeros=zeros)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_planes_in_the_layer_layout_stand_for_the_gguf_values(qtype) -> None:
    """Each type alone decodes into its layer layout (int4 / uint8 per sub-block, or MX for MXFP4),
    which the GEMMs' reference dequantizes to gguf's values."""
    cols = _cols(qtype)
    raw = random_blocks(qtype, 37, cols, seed=3)
    weight = _decoded(raw, qtype, cols, layer_quant_for((qtype,)).scheme)
    _close(reference.dequantize_weight(weight), torch.from_numpy(dequantize(raw, qtype).copy()))


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_K, Q.Q5_1, Q.MXFP4], ids=lambda t: t.name)
def test_planes_widen_to_a_common_layout_for_mixed_fused_layers(qtype) -> None:
    """A fused layer whose shards differ decodes each into uint8 planes with 16-column groups."""
    cols = _cols(qtype)
    raw = random_blocks(qtype, 9, cols, seed=5)
    weight = _decoded(raw, qtype, cols, QuantScheme(UINT8, "group", "none", group_size=16))
    _close(reference.dequantize_weight(weight), torch.from_numpy(dequantize(raw, qtype).copy()))


def test_a_zero_scale_keeps_the_block_minimum_exactly() -> None:
    """Q4_K with d = 0: every value is -dmin * m, which the planes keep (scale 1, zero dmin * m)."""
    raw = random_blocks(Q.Q4_K, 4, 256, seed=7)
    raw[:, 0:2] = np.zeros(1, np.float16).view(np.uint8)
    want = torch.from_numpy(dequantize(raw, Q.Q4_K).copy())
    weight = _decoded(raw, Q.Q4_K, 256, layer_quant_for((Q.Q4_K,)).scheme)
    assert torch.equal(reference.dequantize_weight(weight), want)
    assert torch.equal(dequantize_gguf(torch.from_numpy(raw), Q.Q4_K, 256, torch.float32), want)


def test_types_without_a_decoder_and_wrong_sizes_are_refused() -> None:
    raw = torch.zeros(2, 66, dtype=torch.uint8)
    with pytest.raises(ValueError, match="GGUF type IQ2_XXS has no Triton decoder"):
        dequantize_gguf(raw, Q.IQ2_XXS, 256, torch.float32)
    with pytest.raises(ValueError, match=r"Q8_0 bytes \(2, 66\) torch.uint8 do not hold rows of 96 values"):
        dequantize_gguf(raw, Q.Q8_0, 96, torch.float32)
