"""Rotary position embedding of q and k in one launch, out of place.

Grid (token blocks, 2): axis 1 picks q (0) or k (1), so both tensors are served by one launch and
a decode step with few tokens still has two programs per token block. A program gathers cos/sin
of its tokens' positions once and rotates its heads in blocks of BLOCK_HEADS. Rotation pairs:
NeoX (i, i + rot_dim/2), GPT-J (2i, 2i + 1); dims from rot_dim to head_dim are copied unchanged
(cos 1, sin 0 there).
"""

from __future__ import annotations

from tritonllm import platform  # isort: skip  (on CPU it switches on the interpreter before triton loads)

import torch
import triton
import triton.language as tl

from tritonllm.kernels.launch import DEFAULT_NUM_STAGES, Launcher, aligned, int_spec, pdl_wait
from tritonllm.kernels.registry import FLOATS, Supports, register


@triton.jit
def _rotate_heads(
    x_ptr,  # [num_tokens, num_heads * HEAD_DIM], rows x_row_stride apart, dims contiguous
    out_ptr,  # [num_tokens, num_heads * HEAD_DIM] contiguous
    x_row_stride,
    num_heads,
    tokens,  # [BLOCK_T] int64 token indices of this program
    token_mask,  # [BLOCK_T]
    partner,  # [BLOCK_D] the dim each dim is paired with (read for NeoX only)
    cos,  # [BLOCK_T, 1, BLOCK_D] float32; 1 past ROT_DIM
    signed_sin,  # [BLOCK_T, 1, BLOCK_D] float32; -sin on a pair's first dim, +sin on its second, 0 past ROT_DIM
    HEAD_DIM: tl.constexpr,
    ROT_DIM: tl.constexpr,
    IS_NEOX: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    dims = tl.arange(0, BLOCK_D)[None, None, :]
    x_rows = (tokens * x_row_stride)[:, None, None]
    out_rows = (tokens * num_heads * HEAD_DIM)[:, None, None]
    for head_start in range(0, num_heads, BLOCK_HEADS):
        heads = head_start + tl.arange(0, BLOCK_HEADS)
        head_offs = (heads * HEAD_DIM)[None, :, None]
        row_mask = token_mask[:, None, None] & (heads < num_heads)[None, :, None]
        x = tl.load(x_ptr + x_rows + head_offs + dims, mask=row_mask & (dims < HEAD_DIM), other=0.0)
        if IS_NEOX:
            # the partner read touches the same cache lines as x: both loads stay coalesced
            partner_ptrs = x_ptr + x_rows + head_offs + partner[None, None, :]
            x_partner = tl.load(partner_ptrs, mask=row_mask & (dims < ROT_DIM), other=0.0)
        else:
            # swap neighbours in registers: a load at d ^ 1 is not provably contiguous and runs
            # element by element (3x slower); past ROT_DIM the swapped values meet sin = 0
            even, odd = tl.split(tl.reshape(x, [BLOCK_T, BLOCK_HEADS, BLOCK_D // 2, 2]))
            x_partner = tl.reshape(tl.join(odd, even), [BLOCK_T, BLOCK_HEADS, BLOCK_D])
        out = x.to(tl.float32) * cos + x_partner.to(tl.float32) * signed_sin
        tl.store(
            out_ptr + out_rows + head_offs + dims, out.to(out_ptr.dtype.element_ty), mask=row_mask & (dims < HEAD_DIM)
        )


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
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)
    # out[d] = x[d] * cos[f(d)] + sign(d) * x[partner(d)] * sin[f(d)] for d < ROT_DIM, out[d] = x[d] after:
    # one contiguous tile per head for both layouts (a stride-2 GPT-J gather ran ~10x slower)
    HALF: tl.constexpr = ROT_DIM // 2
    dims = tl.arange(0, BLOCK_D)
    if IS_NEOX:
        first = dims < HALF
        partner = tl.where(first, dims + HALF, dims - HALF)
        freq = tl.where(first, dims, dims - HALF)
    else:
        first = dims % 2 == 0
        partner = dims  # unused: GPT-J swaps neighbours in registers
        freq = dims // 2
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    token_mask = tokens < num_tokens
    tokens = tokens.to(tl.int64)
    positions = tl.load(positions_ptr + tokens, mask=token_mask, other=0).to(tl.int64)
    cs_offs = (positions * ROT_DIM)[:, None] + freq[None, :]
    cs_mask = token_mask[:, None] & (dims < ROT_DIM)[None, :]
    cos = tl.load(cache_ptr + cs_offs, mask=cs_mask, other=1.0).to(tl.float32)
    sin = tl.load(cache_ptr + cs_offs + HALF, mask=cs_mask, other=0.0).to(tl.float32)
    signed_sin = tl.where(first[None, :], -sin, sin)[:, None, :]
    cos = cos[:, None, :]
    if tl.program_id(1) == 0:
        _rotate_heads(
            q_ptr, q_out_ptr, q_row_stride, num_q_heads, tokens, token_mask, partner, cos, signed_sin,
            HEAD_DIM, ROT_DIM, IS_NEOX, BLOCK_T, BLOCK_HEADS, BLOCK_D,
        )  # fmt: skip
    else:
        _rotate_heads(
            k_ptr, k_out_ptr, k_row_stride, num_kv_heads, tokens, token_mask, partner, cos, signed_sin,
            HEAD_DIM, ROT_DIM, IS_NEOX, BLOCK_T, BLOCK_HEADS, BLOCK_D,
        )  # fmt: skip


_ROTARY = Launcher(_rotary_kernel)


def _as_token_rows(x: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[num_tokens, ...] -> [num_tokens, heads * head_dim] with contiguous dims (a view if possible)."""
    x2 = x.reshape(num_tokens, -1)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


@register("rotary", "triton", supports=Supports(dtypes=FLOATS), priority=10)
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
    if q2.shape[1] % head_dim or k2.shape[1] % head_dim:
        raise ValueError(f"q width {q2.shape[1]} and k width {k2.shape[1]} must be multiples of head_dim {head_dim}")
    num_q_heads, num_kv_heads = q2.shape[1] // head_dim, k2.shape[1] // head_dim
    cache = cos_sin_cache if cos_sin_cache.is_contiguous() else cos_sin_cache.contiguous()
    block_d = triton.next_power_of_2(head_dim)
    if platform.is_interpreter():
        # few, big programs: the interpreter pays milliseconds per program and per loop step
        block_t = triton.next_power_of_2(triton.cdiv(num_tokens, 4))
        block_heads = triton.next_power_of_2(max(num_q_heads, num_kv_heads))
        num_warps = 1
    else:
        block_t = 1
        block_heads = min(triton.next_power_of_2(max(num_q_heads, num_kv_heads)), max(1, 4096 // block_d))
        num_warps = 4
    q_row_stride, k_row_stride = q2.stride(0), k2.stride(0)
    args = (positions, q2, k2, q_out, k_out, cache, num_tokens, num_q_heads, num_kv_heads, q_row_stride, k_row_stride)
    constexprs = dict(
        HEAD_DIM=head_dim, ROT_DIM=rot_dim, IS_NEOX=is_neox, BLOCK_T=block_t, BLOCK_HEADS=block_heads, BLOCK_D=block_d
    )
    device_index = q.device.index or 0
    # q_out and k_out have q's and k's dtypes; all but num_tokens are fixed by the model: raw values
    key = (
        positions.dtype, q.dtype, k.dtype, cache.dtype, aligned(positions, q2, k2, q_out, k_out, cache),
        int_spec(num_tokens), num_q_heads, num_kv_heads, q_row_stride, k_row_stride,
    )  # fmt: skip
    _ROTARY(
        key, (triton.cdiv(num_tokens, block_t), 2), args, constexprs, num_warps=num_warps, num_stages=DEFAULT_NUM_STAGES,
        device_index=device_index,
    )  # fmt: skip
    return q_out, k_out
