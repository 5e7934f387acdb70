"""Rotary position embedding of q and k in one launch, out of place.

Grid (token blocks, 2): axis 1 picks q (0) or k (1), so both tensors are served by one launch and
a decode step with few tokens still has two programs per token block. A program gathers cos/sin
of its tokens' positions once and rotates its heads in blocks of BLOCK_HEADS. Rotation pairs:
NeoX (i, i + rot_dim/2), GPT-J (2i, 2i + 1); dims from rot_dim to head_dim are copied unchanged.
"""

from __future__ import annotations

from tritonllm import platform  # isort: skip  (on CPU it switches on the interpreter before triton loads)

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    x_ptr,  # [num_tokens, num_heads * HEAD_DIM], rows x_row_stride apart, dims contiguous
    out_ptr,  # [num_tokens, num_heads * HEAD_DIM] contiguous
    x_row_stride,
    num_heads,
    tokens,  # [BLOCK_T] int64 token indices of this program
    token_mask,  # [BLOCK_T]
    cos,  # [BLOCK_T, 1, BLOCK_HALF] float32
    sin,  # [BLOCK_T, 1, BLOCK_HALF] float32
    HEAD_DIM: tl.constexpr,
    ROT_DIM: tl.constexpr,
    IS_NEOX: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    half = tl.arange(0, BLOCK_HALF)[None, None, :]
    if IS_NEOX:
        dim1, dim2 = half, half + ROT_DIM // 2
    else:
        dim1, dim2 = 2 * half, 2 * half + 1
    pass_dims = ROT_DIM + tl.arange(0, BLOCK_PASS)[None, None, :]
    x_rows = (tokens * x_row_stride)[:, None, None]
    out_rows = (tokens * num_heads * HEAD_DIM)[:, None, None]
    for head_start in range(0, num_heads, BLOCK_HEADS):
        heads = head_start + tl.arange(0, BLOCK_HEADS)
        head_offs = (heads * HEAD_DIM)[None, :, None]
        row_mask = token_mask[:, None, None] & (heads < num_heads)[None, :, None]
        pair_mask = row_mask & (half < ROT_DIM // 2)
        x1 = tl.load(x_ptr + x_rows + head_offs + dim1, mask=pair_mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + x_rows + head_offs + dim2, mask=pair_mask, other=0.0).to(tl.float32)
        out1 = x1 * cos - x2 * sin
        out2 = x2 * cos + x1 * sin
        out_ty = out_ptr.dtype.element_ty
        tl.store(out_ptr + out_rows + head_offs + dim1, out1.to(out_ty), mask=pair_mask)
        tl.store(out_ptr + out_rows + head_offs + dim2, out2.to(out_ty), mask=pair_mask)
        if ROT_DIM < HEAD_DIM:
            rest_mask = row_mask & (pass_dims < HEAD_DIM)
            rest = tl.load(x_ptr + x_rows + head_offs + pass_dims, mask=rest_mask)
            tl.store(out_ptr + out_rows + head_offs + pass_dims, rest.to(out_ty), mask=rest_mask)


@triton.jit
def _rotary_kernel(
    positions_ptr,  # [num_tokens] int32 or int64
    q_ptr,  # [num_tokens, num_q_heads * HEAD_DIM], rows q_row_stride apart
    k_ptr,  # [num_tokens, num_kv_heads * HEAD_DIM], rows k_row_stride apart
    q_out_ptr,  # [num_tokens, num_q_heads * HEAD_DIM] contiguous
    k_out_ptr,  # [num_tokens, num_kv_heads * HEAD_DIM] contiguous
    cache_ptr,  # [max_position, ROT_DIM] contiguous: cos in the first ROT_DIM/2 columns, sin after
    num_tokens,
    num_q_heads,
    num_kv_heads,
    q_row_stride,
    k_row_stride,
    HEAD_DIM: tl.constexpr,
    ROT_DIM: tl.constexpr,
    IS_NEOX: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    token_mask = tokens < num_tokens
    tokens = tokens.to(tl.int64)
    positions = tl.load(positions_ptr + tokens, mask=token_mask, other=0).to(tl.int64)
    half = tl.arange(0, BLOCK_HALF)
    cs_offs = (positions * ROT_DIM)[:, None] + half[None, :]
    cs_mask = token_mask[:, None] & (half < ROT_DIM // 2)[None, :]
    cos = tl.load(cache_ptr + cs_offs, mask=cs_mask, other=0.0).to(tl.float32)[:, None, :]
    sin = tl.load(cache_ptr + cs_offs + ROT_DIM // 2, mask=cs_mask, other=0.0).to(tl.float32)[:, None, :]
    if tl.program_id(1) == 0:
        _rotate_heads(
            q_ptr, q_out_ptr, q_row_stride, num_q_heads, tokens, token_mask, cos, sin,
            HEAD_DIM, ROT_DIM, IS_NEOX, BLOCK_HEADS, BLOCK_HALF, BLOCK_PASS,
        )  # fmt: skip
    else:
        _rotate_heads(
            k_ptr, k_out_ptr, k_row_stride, num_kv_heads, tokens, token_mask, cos, sin,
            HEAD_DIM, ROT_DIM, IS_NEOX, BLOCK_HEADS, BLOCK_HALF, BLOCK_PASS,
        )  # fmt: skip


def _as_token_rows(x: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[num_tokens, ...] -> [num_tokens, heads * head_dim] with contiguous dims (a view if possible)."""
    x2 = x.reshape(num_tokens, -1)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_dim: int,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [num_tokens]; q [num_tokens, num_heads * head_dim]; k [num_tokens, num_kv_heads *
    head_dim] (rows may be strided, e.g. slices of a fused qkv output); cos_sin_cache [max_position,
    rot_dim]. Returns new (q, k) of the input shapes, the first rot_dim dims of every head rotated."""
    num_tokens = positions.shape[0]
    rot_dim = cos_sin_cache.shape[-1]
    if rot_dim > head_dim or rot_dim % 2:
        raise ValueError(f"rotary dim {rot_dim} must be even and at most head_dim {head_dim}")
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if num_tokens == 0:
        return q_out, k_out
    q2, k2 = _as_token_rows(q, num_tokens), _as_token_rows(k, num_tokens)
    num_q_heads, num_kv_heads = q2.shape[1] // head_dim, k2.shape[1] // head_dim
    cache = cos_sin_cache if cos_sin_cache.is_contiguous() else cos_sin_cache.contiguous()
    block_half = triton.next_power_of_2(rot_dim // 2)
    block_pass = triton.next_power_of_2(max(head_dim - rot_dim, 1))
    if platform.is_interpreter():
        # few, big programs: the interpreter pays milliseconds per program and per loop step
        block_t = triton.next_power_of_2(triton.cdiv(num_tokens, 4))
        block_heads = triton.next_power_of_2(max(num_q_heads, num_kv_heads))
        num_warps = 1
    else:
        block_t = 1
        block_heads = min(triton.next_power_of_2(max(num_q_heads, num_kv_heads)), max(1, 2048 // block_half))
        num_warps = 4
    _rotary_kernel[(triton.cdiv(num_tokens, block_t), 2)](
        positions,
        q2,
        k2,
        q_out,
        k_out,
        cache,
        num_tokens,
        num_q_heads,
        num_kv_heads,
        q2.stride(0),
        k2.stride(0),
        HEAD_DIM=head_dim,
        ROT_DIM=rot_dim,
        IS_NEOX=is_neox,
        BLOCK_T=block_t,
        BLOCK_HEADS=block_heads,
        BLOCK_HALF=block_half,
        BLOCK_PASS=block_pass,
        num_warps=num_warps,
    )
    return q_out, k_out
