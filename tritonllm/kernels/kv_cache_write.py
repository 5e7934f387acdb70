"""Write the step's new K and V rows into the paged KV cache.

Layouts (element strides passed in; the last dim of every tensor must be contiguous):
  k, v           [num_tokens, num_kv_heads, head_dim]   any dtype, cast to the cache's
  k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim]
  slot_mapping   [num_tokens] int: slot = physical_block * block_size + offset; < 0 skips the token
                 (padding rows of a CUDA-graph batch).
A program copies TOKENS_PER_PROGRAM tokens x all heads, so CPU grids stay small and a GPU program
moves a few KiB; heads and dims are flattened into one padded axis of length HEADS_X_DIM_PAD.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# platform switches on the interpreter on CPU; triton reads that when a kernel is defined, below
from tritonllm import platform


@triton.jit
def _write_kv_cache_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    num_tokens,
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_X_DIM: tl.constexpr,
    HEADS_X_DIM_PAD: tl.constexpr,
    TOKENS_PER_PROGRAM: tl.constexpr,
):
    tokens = tl.program_id(0) * TOKENS_PER_PROGRAM + tl.arange(0, TOKENS_PER_PROGRAM)
    token_ok = tokens < num_tokens
    slots = tl.load(slot_mapping_ptr + tokens, mask=token_ok, other=-1).to(tl.int64)
    row_ok = token_ok & (slots >= 0)
    # slots < 0 would give negative block ids; clamp so even masked-off addresses stay in range
    slots = tl.maximum(slots, 0)
    blocks = slots // BLOCK_SIZE
    offsets = slots % BLOCK_SIZE

    elems = tl.arange(0, HEADS_X_DIM_PAD)
    heads = elems // HEAD_DIM
    dims = elems % HEAD_DIM
    mask = row_ok[:, None] & (elems < HEADS_X_DIM)[None, :]
    tok64 = tokens.to(tl.int64)[:, None]

    k = tl.load(k_ptr + tok64 * stride_k_token + (heads * stride_k_head + dims)[None, :], mask=mask)
    v = tl.load(v_ptr + tok64 * stride_v_token + (heads * stride_v_head + dims)[None, :], mask=mask)
    k_dst = blocks[:, None] * stride_kc_block + offsets[:, None] * stride_kc_slot
    v_dst = blocks[:, None] * stride_vc_block + offsets[:, None] * stride_vc_slot
    k_dst += (heads * stride_kc_head + dims)[None, :]
    v_dst += (heads * stride_vc_head + dims)[None, :]
    tl.store(k_cache_ptr + k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k, v [num_tokens, num_kv_heads, head_dim]; caches [num_blocks, block_size, num_kv_heads,
    head_dim]; token t goes to slot s = slot_mapping[t] = block * block_size + offset (s < 0: skip)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"write_kv_cache: {name} must be contiguous in head_dim (stride {t.stride()})")
    heads_x_dim = num_kv_heads * head_dim
    # GPU: ~4 tokens x 8 heads x 128 dims per program; interpreter: few, fat programs
    tokens_per_program = 4 if platform.is_gpu() else 16
    grid = (triton.cdiv(num_tokens, tokens_per_program),)
    _write_kv_cache_kernel[grid](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        num_tokens,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim,
        HEADS_X_DIM=heads_x_dim,
        HEADS_X_DIM_PAD=triton.next_power_of_2(heads_x_dim),
        TOKENS_PER_PROGRAM=tokens_per_program,
        num_warps=4,
    )
