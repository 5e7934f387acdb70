"""Rotary embedding kernel against the torch reference: NeoX and GPT-J layouts, full and partial
rotary, random positions gathered from Llama-like cos/sin caches, q and k read from a fused qkv.
The fused RoPE + KV-cache write against the two kernels it replaces: the same bytes everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tritonllm.kernels import reference
from tritonllm.kernels.kv_cache_write import write_kv_cache
from tritonllm.kernels.rmsnorm import rms_norm
from tritonllm.kernels.rotary import rotary_embedding, rotary_write_kv_cache

TOLERANCES = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _cos_sin_cache(max_position: int, rot_dim: int, base: float) -> torch.Tensor:
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim)
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _check(num_tokens, num_heads, num_kv_heads, head_dim, rot_dim, is_neox, dtype, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    max_position = 8192
    cache = _cos_sin_cache(max_position, rot_dim, base=500000.0 if seed % 2 else 10000.0).to(device)
    positions = torch.randint(0, max_position, (num_tokens,), generator=gen).to(device)
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(device, dtype)
    q = qkv[:, : num_heads * head_dim]
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim]
    qkv_before = qkv.clone()
    q_out, k_out = rotary_embedding(positions, q, k, cache, head_dim, is_neox)
    q_ref, k_ref = reference.rotary_embedding(positions, q, k, cache, head_dim, is_neox)
    tol = TOLERANCES[dtype]
    for actual, expected in ((q_out, q_ref), (k_out, k_ref)):
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)
    assert torch.equal(qkv, qkv_before), "rotary_embedding must not write its inputs"


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize(
    "num_tokens, num_heads, num_kv_heads, head_dim, rot_dim",
    [
        (1, 4, 4, 64, 64),  # decode of one sequence, MHA
        (37, 6, 2, 64, 64),  # GQA
        (13, 5, 1, 128, 64),  # partial rotary (half)
        (29, 3, 3, 80, 32),  # head_dim 80, rot 32 (Phi-like)
        (50, 7, 1, 96, 96),  # non-power-of-two head_dim
    ],
)
def test_rotary_matches_reference(num_tokens, num_heads, num_kv_heads, head_dim, rot_dim, is_neox) -> None:
    _check(num_tokens, num_heads, num_kv_heads, head_dim, rot_dim, is_neox, torch.float32, seed=num_tokens)


@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_matches_reference_in_float16(is_neox: bool) -> None:
    _check(21, 8, 2, 128, 128, is_neox, torch.float16, seed=3)


def test_rotary_accepts_three_dimensional_heads() -> None:
    gen = torch.Generator().manual_seed(5)
    cache = _cos_sin_cache(1000, 64, 10000.0)
    positions = torch.randint(0, 1000, (9,), generator=gen, dtype=torch.int32)
    q, k = torch.randn(9, 4, 64, generator=gen), torch.randn(9, 2, 64, generator=gen)
    q_out, k_out = rotary_embedding(positions, q, k, cache, 64, True)
    q_ref, k_ref = reference.rotary_embedding(positions, q, k, cache, 64, True)
    torch.testing.assert_close(q_out, q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, k_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize(
    "num_tokens, num_heads, num_kv_heads, head_dim, rot_dim",
    [(1, 32, 8, 128, 128), (4099, 32, 8, 128, 128), (1000, 40, 8, 128, 64), (333, 16, 16, 256, 256)],
)
def test_rotary_bfloat16_on_gpu(num_tokens, num_heads, num_kv_heads, head_dim, rot_dim, is_neox) -> None:
    _check(num_tokens, num_heads, num_kv_heads, head_dim, rot_dim, is_neox, torch.bfloat16, "cuda", seed=7)


def _check_fused(
    num_tokens, num_heads, num_kv_heads, head_dim, rot_dim, is_neox, dtype, cache_dtype, device="cpu", qk_norm=False,
    exact=True,
):  # fmt: skip
    """rotary_write_kv_cache against rotary_embedding then write_kv_cache (the unfused path the engine
    takes with fuse_rope_kv_write=false; with qk_norm, rms_norm of every head first): equal q, k and
    caches, bit for bit; a quarter of the tokens skipped (slot -1), the slots scattered over the blocks.
    exact=False: within a rounding of the model's dtype (a GPU's RMSNorm reductions may be ordered
    differently in the two kernels), the FP8 cache within one e4m3 step."""
    gen = torch.Generator().manual_seed(num_tokens)
    block_size, num_blocks = 16, num_tokens // 8 + 3
    cache = _cos_sin_cache(4096, rot_dim, 10000.0).to(device)
    positions = torch.randint(0, 4096, (num_tokens,), generator=gen).to(device)
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(device, dtype)
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=1)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[torch.rand(num_tokens, generator=gen) < 0.25] = -1
    slots = slots.to(device)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(device, cache_dtype)
    v_cache = torch.randn(shape, generator=gen).to(device, cache_dtype)
    scales = dict(k_scale=torch.tensor([0.02], device=device), v_scale=torch.tensor([0.03], device=device))
    caches = [(k_cache.clone(), v_cache.clone()) for _ in range(2)]
    norm = None
    if qk_norm:
        weights = (1 + 0.3 * torch.randn(2, head_dim, generator=gen)).to(device, dtype)
        norm = (weights[0], weights[1], 1e-6)
    q_out, k_out = rotary_write_kv_cache(
        positions, q, k, v, cache, head_dim, is_neox, *caches[0], slots, **scales, qk_norm=norm
    )
    if qk_norm:  # what the engine's unfused path runs: the RMSNorm kernel over [tokens * heads, head_dim]
        q = rms_norm(q.reshape(-1, head_dim), norm[0], 1e-6).view(num_tokens, -1)
        k = rms_norm(k.reshape(-1, head_dim), norm[1], 1e-6).view(num_tokens, -1)
    q_ref, k_ref = rotary_embedding(positions, q, k, cache, head_dim, is_neox)
    rows = (num_tokens, num_kv_heads, head_dim)
    write_kv_cache(k_ref.view(rows), v.reshape(rows), *caches[1], slots, **scales)
    if not exact:
        tol = TOLERANCES[dtype]
        for got, expected in ((q_out, q_ref), (k_out, k_ref), *zip(caches[0], caches[1], strict=True)):
            rtol = 0.13 if got.dtype.itemsize == 1 else tol  # e4m3: 3 mantissa bits
            torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=rtol)
        return
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)
    for got, expected in zip(caches[0], caches[1], strict=True):
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
    assert not torch.equal(caches[0][0].view(torch.uint8), k_cache.view(torch.uint8))  # it did write


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16, torch.float8_e4m3fn, torch.float8_e4m3fnuz])
@pytest.mark.parametrize(
    "num_tokens, num_heads, num_kv_heads, head_dim, rot_dim",
    [(1, 4, 2, 64, 64), (37, 6, 2, 80, 32), (19, 5, 1, 96, 96)],
)
def test_fused_cache_write_equals_the_two_kernels(
    num_tokens, num_heads, num_kv_heads, head_dim, rot_dim, is_neox, cache_dtype
) -> None:
    _check_fused(num_tokens, num_heads, num_kv_heads, head_dim, rot_dim, is_neox, torch.float32, cache_dtype)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float8_e4m3fn])
def test_fused_qk_norm_equals_the_norm_kernel_then_the_two_kernels(is_neox, cache_dtype) -> None:
    """Qwen3's per-head RMSNorm of q and k before RoPE, in the same launch (partial rotary: the norm
    covers every dim, RoPE the first 48)."""
    _check_fused(29, 6, 2, 64, 48, is_neox, torch.float32, cache_dtype, qk_norm=True)


def test_fused_cache_write_rejects_a_cache_of_other_heads() -> None:
    cache = _cos_sin_cache(64, 64, 10000.0)
    q, k, v = torch.randn(3, 4 * 64), torch.randn(3, 2 * 64), torch.randn(3, 2 * 64)
    wrong = torch.zeros(2, 16, 4, 64)  # 4 KV heads, k has 2
    with pytest.raises(ValueError, match="k_cache must be"):
        rotary_write_kv_cache(torch.arange(3), q, k, v, cache, 64, True, wrong, wrong.clone(), torch.arange(3))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("num_tokens", [1, 7, 4099])
def test_fused_cache_write_bfloat16_on_gpu(num_tokens, cache_dtype) -> None:
    _check_fused(num_tokens, 32, 8, 128, 128, True, torch.bfloat16, cache_dtype, "cuda")
    _check_fused(num_tokens, 16, 8, 128, 128, True, torch.bfloat16, cache_dtype, "cuda", qk_norm=True, exact=False)


def test_the_kernel_compiles_for_sm90_and_gfx942_with_and_without_the_cache_write() -> None:
    """The interpreter runs only the branches a launch takes; a GPU compiles them all (with the cache
    pointers None when RoPE runs alone). In a subprocess: this one runs the interpreter."""
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "scripts/cross_compile_attention.py", "--rope"], cwd=root,
        env=dict(os.environ, TRITON_INTERPRET="0"), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert result.stdout.count(": ok") == 8, result.stdout
