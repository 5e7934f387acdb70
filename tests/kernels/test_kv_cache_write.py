"""write_kv_cache (Triton) against the torch reference: shuffled slots, padding slots, strided inputs,
FP8 caches (bit for bit: the interpreter runs FP8 loads and casts, so these run on CPU too)."""

from __future__ import annotations

import pytest
import torch

from tritonllm import platform
from tritonllm.kernels import reference
from tritonllm.kernels.kv_cache_write import write_kv_cache

FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]


def _random_slots(num_tokens: int, num_slots: int, num_padding: int, gen: torch.Generator) -> torch.Tensor:
    """Distinct random slots for num_tokens - num_padding tokens, -1 for the rest, in random order."""
    slots = torch.randperm(num_slots, generator=gen)[: num_tokens - num_padding]
    slots = torch.cat([slots, torch.full((num_padding,), -1)])
    return slots[torch.randperm(num_tokens, generator=gen)]


def _check(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor):
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    reference.write_kv_cache(k, v, expected_k, expected_v, slots)
    write_kv_cache(k, v, k_cache, v_cache, slots)
    torch.testing.assert_close(k_cache, expected_k, atol=0, rtol=0)
    torch.testing.assert_close(v_cache, expected_v, atol=0, rtol=0)


@pytest.mark.parametrize(
    "num_tokens, num_kv_heads, head_dim, block_size",
    [(37, 2, 64, 16), (5, 3, 128, 8), (53, 1, 64, 1), (20, 8, 128, 32)],
)
def test_write_matches_reference_and_skips_padding(
    num_tokens: int, num_kv_heads: int, head_dim: int, block_size: int
) -> None:
    gen = torch.Generator().manual_seed(num_tokens)
    num_blocks = -(-2 * num_tokens // block_size) + 1
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(cache_shape, generator=gen), torch.randn(cache_shape, generator=gen)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen)
    slots = _random_slots(num_tokens, num_blocks * block_size, num_tokens // 5, gen)
    _check(k, v, k_cache, v_cache, slots)


def test_write_from_fused_qkv_views_casts_to_cache_dtype() -> None:
    """k and v as strided views of one [num_tokens, q | k | v] tensor; a float16 cache."""
    gen = torch.Generator().manual_seed(1)
    num_tokens, num_heads, num_kv_heads, head_dim, block_size = 19, 4, 2, 64, 16
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen)
    _, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    k = k.view(num_tokens, num_kv_heads, head_dim)
    v = v.view(num_tokens, num_kv_heads, head_dim)
    cache_shape = (4, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(cache_shape, generator=gen).half()
    v_cache = torch.randn(cache_shape, generator=gen).half()
    slots = _random_slots(num_tokens, 4 * block_size, 3, gen)
    _check(k, v, k_cache, v_cache, slots)


def test_all_padding_leaves_cache_untouched() -> None:
    gen = torch.Generator().manual_seed(2)
    k_cache, v_cache = torch.randn(3, 8, 2, 64, generator=gen), torch.randn(3, 8, 2, 64, generator=gen)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    k, v = torch.randn(6, 2, 64, generator=gen), torch.randn(6, 2, 64, generator=gen)
    write_kv_cache(k, v, k_cache, v_cache, torch.full((6,), -1, dtype=torch.int64))
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)


def _fp8_edge_values(dtype: torch.dtype, scale: float) -> torch.Tensor:
    """Inputs that land on every FP8 value, on every tie between neighbours (round to even; exact
    ties only for power-of-two scales), past the largest value (clamped) and below the smallest
    subnormal, times the scale."""
    grid = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    grid = grid[grid.isfinite()].unique()
    ties = (grid[1:] + grid[:-1]) / 2
    beyond = torch.tensor([1e4, -1e4, 3 * torch.finfo(dtype).max, 1e-9, -1e-9])
    return torch.cat([grid, ties, beyond]) * scale


def _check_fp8(
    k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype, num_blocks: int, slots: torch.Tensor, scales=(0.25, 2.5)
) -> None:
    k_scale = torch.full((1,), scales[0], device=k.device)
    v_scale = torch.full((1,), scales[1], device=k.device)
    cache_shape = (num_blocks, 16, k.shape[1], k.shape[2])
    k_cache = torch.randn(cache_shape).to(k.device, dtype)
    v_cache = torch.randn(cache_shape).to(k.device, dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    reference.write_kv_cache(k, v, expected_k, expected_v, slots, k_scale=k_scale, v_scale=v_scale)
    write_kv_cache(k, v, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)
    # Exact values; only the sign of a zero may differ (the H200 kernel writes +0 where torch's cast
    # gives -0 for tiny negatives, seen 2026-11-29), which no attention result can tell apart.
    assert torch.equal(k_cache.float(), expected_k.float())
    assert torch.equal(v_cache.float(), expected_v.float())


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_fp8_write_rounds_to_nearest_even_and_clamps_like_reference(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(4)
    num_kv_heads, head_dim = 2, 64
    edges_k = _fp8_edge_values(dtype, 0.25)
    edges_v = _fp8_edge_values(dtype, 2.5)
    num_tokens = -(-edges_k.numel() // (num_kv_heads * head_dim)) + 3
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen) * 40
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen) * 300
    k.view(-1)[: edges_k.numel()] = edges_k
    v.view(-1)[: edges_v.numel()] = edges_v
    num_blocks = -(-2 * num_tokens // 16)
    slots = _random_slots(num_tokens, num_blocks * 16, 2, gen)
    _check_fp8(k, v, dtype, num_blocks, slots)


def test_fp8_write_from_bfloat16_matches_reference() -> None:
    gen = torch.Generator().manual_seed(5)
    k = (torch.randn(21, 3, 64, generator=gen) * 10).bfloat16()
    v = (torch.randn(21, 3, 64, generator=gen) * 0.01).bfloat16()
    _check_fp8(k, v, torch.float8_e4m3fn, 3, _random_slots(21, 48, 4, gen))


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_fp8_reference_round_trip_is_within_half_a_step(dtype: torch.dtype) -> None:
    """The reference's quantization: dequantized values within half an FP8 step of the input
    (relative 2^-4 for normal values, 2^(min_exp - 4) absolute below), clamped beyond the range."""
    gen = torch.Generator().manual_seed(6)
    info = torch.finfo(dtype)
    scale = torch.full((1,), 0.05)
    x = torch.randn(64, 2, 64, generator=gen) * torch.logspace(-4, 1.5, 64)[:, None, None]
    cache = torch.zeros(4, 16, 2, 64, dtype=dtype)
    reference.write_kv_cache(x, x, cache, cache, torch.arange(64), k_scale=scale, v_scale=scale)
    dequantized = cache.reshape(64, 2, 64).float() * scale
    in_range = x.abs() <= info.max * scale
    bound = torch.maximum(x.abs() * 2.0**-4, torch.full_like(x, info.tiny * 2.0**-4 * scale.item()))
    assert ((dequantized - x).abs() <= bound * 1.0001)[in_range].all()
    clamped = dequantized[~in_range]
    assert torch.equal(clamped.abs(), torch.full_like(clamped, info.max) * scale)


def test_fp8_write_without_scales_is_rejected() -> None:
    cache = torch.zeros(2, 16, 2, 64, dtype=torch.float8_e4m3fn)
    k = torch.randn(3, 2, 64)
    with pytest.raises(ValueError, match="k_scale"):
        write_kv_cache(k, k, cache, cache, torch.arange(3))


@pytest.mark.gpu
def test_gpu_fp8_write_matches_reference() -> None:
    gen = torch.Generator().manual_seed(7)
    dtype = platform.fp8_e4m3_dtype()
    edges = _fp8_edge_values(dtype, 0.25)
    k = torch.randn(4099, 8, 128, generator=gen) * 40
    k.view(-1)[: edges.numel()] = edges
    v = torch.randn(4099, 8, 128, generator=gen) * 300
    slots = _random_slots(4099, 600 * 16, 17, gen)
    _check_fp8(k.to("cuda", torch.bfloat16), v.to("cuda", torch.bfloat16), dtype, 600, slots.to("cuda"))
    _check_fp8(k.cuda(), v.cuda(), dtype, 600, slots.cuda())


@pytest.mark.gpu
def test_gpu_write_bfloat16_matches_reference() -> None:
    gen = torch.Generator().manual_seed(3)
    num_tokens, num_kv_heads, head_dim, block_size, num_blocks = 4099, 8, 128, 16, 600
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(cache_shape, generator=gen).to("cuda", torch.bfloat16)
    v_cache = torch.randn(cache_shape, generator=gen).to("cuda", torch.bfloat16)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to("cuda", torch.bfloat16)
    slots = _random_slots(num_tokens, num_blocks * block_size, 17, gen).to("cuda")
    _check(k, v, k_cache, v_cache, slots)
