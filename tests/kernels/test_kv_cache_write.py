"""write_kv_cache (Triton) against the torch reference: shuffled slots, padding slots, strided inputs."""

from __future__ import annotations

import pytest
import torch

from tritonllm.kernels import reference
from tritonllm.kernels.kv_cache_write import write_kv_cache


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
