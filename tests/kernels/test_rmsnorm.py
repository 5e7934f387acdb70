"""RMSNorm kernels against the torch reference: ragged row counts, non-power-of-two hidden sizes,
strided rows (per-head q/k norm read straight out of a fused qkv output) and the fused residual add."""

from __future__ import annotations

import pytest
import torch

from tritonllm.kernels import reference
from tritonllm.kernels.rmsnorm import fused_add_rms_norm, rms_norm

TOLERANCES = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
SHAPES = [(1, 64), (7, 300), (33, 1000), (3, 5, 96), (130, 24)]


def _assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    tol = TOLERANCES[expected.dtype]
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str = "cpu", seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).to(device, dtype)
    residual = torch.randn(shape, generator=gen).to(device, dtype)
    weight = (1.0 + 0.5 * torch.randn(shape[-1], generator=gen)).to(device, dtype)
    return x, residual, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_matches_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x, _, weight = _inputs(shape, dtype)
    _assert_close(rms_norm(x, weight, 1e-6), reference.rms_norm(x, weight, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_add_rms_norm_matches_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x, residual, weight = _inputs(shape, dtype, seed=1)
    x_before, residual_before = x.clone(), residual.clone()
    out, residual_out = fused_add_rms_norm(x, residual, weight, 1e-5)
    expected_out, expected_residual = reference.fused_add_rms_norm(x, residual, weight, 1e-5)
    _assert_close(out, expected_out)
    _assert_close(residual_out, expected_residual)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)


def test_rms_norm_of_strided_rows_matches_reference() -> None:
    wide, _, _ = _inputs((19, 500), torch.float32, seed=2)
    x = wide[:, 37:337]  # rows 500 elements apart
    weight = _inputs((300,), torch.float32, seed=3)[2]
    _assert_close(rms_norm(x, weight, 1e-6), reference.rms_norm(x, weight, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_per_head_norm_of_fused_qkv_slice_matches_reference(dtype: torch.dtype) -> None:
    num_tokens, num_heads, num_kv_heads, head_dim = 11, 6, 2, 80
    qkv, _, _ = _inputs((num_tokens, (num_heads + 2 * num_kv_heads) * head_dim), dtype, seed=4)
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(num_tokens, num_kv_heads, -1)
    weight = _inputs((head_dim,), dtype, seed=5)[2]
    _assert_close(rms_norm(q, weight, 1e-6), reference.rms_norm(q, weight, 1e-6))
    _assert_close(rms_norm(k, weight, 1e-6), reference.rms_norm(k, weight, 1e-6))


def test_fused_add_rms_norm_with_float32_weight_on_half_inputs() -> None:
    x, residual, _ = _inputs((9, 200), torch.float16, seed=6)
    weight = _inputs((200,), torch.float32, seed=7)[2]
    out, residual_out = fused_add_rms_norm(x, residual, weight, 1e-6)
    expected_out, expected_residual = reference.fused_add_rms_norm(x, residual, weight, 1e-6)
    _assert_close(out, expected_out)
    _assert_close(residual_out, expected_residual)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("shape", [(1, 4096), (1000, 4096), (77, 5120), (2048, 8192)])
def test_rms_norm_bfloat16_on_gpu(shape: tuple[int, ...]) -> None:
    x, residual, weight = _inputs(shape, torch.bfloat16, "cuda", seed=8)
    _assert_close(rms_norm(x, weight, 1e-6), reference.rms_norm(x, weight, 1e-6))
    out, residual_out = fused_add_rms_norm(x, residual, weight, 1e-6)
    expected_out, expected_residual = reference.fused_add_rms_norm(x, residual, weight, 1e-6)
    _assert_close(out, expected_out)
    _assert_close(residual_out, expected_residual)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_per_head_norm_bfloat16_on_gpu() -> None:
    num_tokens, num_heads, num_kv_heads, head_dim = 3000, 32, 8, 128
    qkv, _, _ = _inputs((num_tokens, (num_heads + 2 * num_kv_heads) * head_dim), torch.bfloat16, "cuda", 9)
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    weight = _inputs((head_dim,), torch.bfloat16, "cuda", seed=10)[2]
    _assert_close(rms_norm(q, weight, 1e-6), reference.rms_norm(q, weight, 1e-6))
