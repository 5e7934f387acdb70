"""Rotary position embedding of q and k in one launch, out of place; and the same launch also
writing the step's K (rotated) and V into the paged KV cache (`rotary_write_kv_cache`, the
`rope_kv_write` op: one kernel where a layer ran two, as a decode step at batch 1 is a chain of ~12
small launches a layer).

Grid (token blocks, 2): axis 1 picks q (0) or k (1), so both tensors are served by one launch and
a decode step with few tokens still has two programs per token block; with the cache write, (token
blocks, 3): program 1 also stores its rotated k rows into the cache and program 2 copies v there
(FP8 caches: quantized as kv_cache_write.py does, from the rotated k rounded to the model's dtype
first, so both paths store the same bytes). The fused launch can also RMS-normalise every head of q
and k first (QK_NORM: Qwen3's q_norm / k_norm), two more launches a layer saved. A program gathers
cos/sin of its tokens' positions once and rotates its heads in blocks of BLOCK_HEADS. Rotation pairs:
NeoX (i, i + rot_dim/2), GPT-J (2i, 2i + 1); dims from rot_dim to head_dim are copied unchanged
(cos 1, sin 0 there).
"""

from __future__ import annotations

from tritonllm import platform  # isort: skip  (on CPU it switches on the interpreter before triton loads)

import torch
import triton
import triton.language as tl

from tritonllm.kernels.kv_cache_write import (
    KV_WRITE_SUPPORTS,
    _quantize_fp8,
    check_kv_scales,
    fp8_grid_params,
)
from tritonllm.kernels.launch import DEFAULT_NUM_STAGES, Launcher, aligned, int_spec, pdl_wait
from tritonllm.kernels.registry import FLOATS, Supports, register


@triton.jit
def _store_heads(
    cache_ptr,  # [num_blocks, block_size, num_kv_heads, HEAD_DIM], dims contiguous
    x,  # [BLOCK_T, BLOCK_HEADS, BLOCK_D] in the model's dtype
    cache_rows,  # [BLOCK_T] int64: block * stride_block + offset * stride_slot of each token's slot
    heads,  # [BLOCK_HEADS]
    mask,  # [BLOCK_T, BLOCK_HEADS, BLOCK_D]: real token with a slot, real head, dim < HEAD_DIM
    stride_head,
    scale_ptr,  # [1] float32 (FP8 caches)
    QUANTIZE_FP8: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MANTISSA_BITS: tl.constexpr,
    MIN_NORMAL_EXP: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    if QUANTIZE_FP8:
        x = _quantize_fp8(x.to(tl.float32), tl.load(scale_ptr), FP8_MAX, MANTISSA_BITS, MIN_NORMAL_EXP)
    dims = tl.arange(0, BLOCK_D)[None, None, :]
    offs = cache_rows[:, None, None] + (heads.to(tl.int64) * stride_head)[None, :, None] + dims
    tl.store(cache_ptr + offs, x.to(cache_ptr.dtype.element_ty), mask=mask)


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
    cache_ptr,  # WRITE_CACHE: the rotated rows also go here (_store_heads)
    cache_rows,
    cache_ok,  # [BLOCK_T] the token is real and has a slot
    cache_stride_head,
    scale_ptr,
    norm_weight_ptr,  # QK_NORM: [HEAD_DIM] the RMSNorm weight of every head of x (Qwen3's q_norm / k_norm)
    norm_eps,
    HEAD_DIM: tl.constexpr,
    ROT_DIM: tl.constexpr,
    IS_NEOX: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WRITE_CACHE: tl.constexpr,
    QUANTIZE_FP8: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MANTISSA_BITS: tl.constexpr,
    MIN_NORMAL_EXP: tl.constexpr,
    QK_NORM: tl.constexpr,
):
    dims = tl.arange(0, BLOCK_D)[None, None, :]
    x_rows = (tokens * x_row_stride)[:, None, None]
    out_rows = (tokens * num_heads * HEAD_DIM)[:, None, None]
    if QK_NORM:
        norm_w = tl.load(norm_weight_ptr + dims, mask=dims < HEAD_DIM, other=0.0).to(tl.float32)
        norm_w_partner = tl.load(norm_weight_ptr + partner[None, None, :], mask=dims < ROT_DIM, other=0.0).to(
            tl.float32
        )
    for head_start in range(0, num_heads, BLOCK_HEADS):
        heads = head_start + tl.arange(0, BLOCK_HEADS)
        head_offs = (heads * HEAD_DIM)[None, :, None]
        row_mask = token_mask[:, None, None] & (heads < num_heads)[None, :, None]
        x = tl.load(x_ptr + x_rows + head_offs + dims, mask=row_mask & (dims < HEAD_DIM), other=0.0)
        if QK_NORM:  # per head over HEAD_DIM, rounded to x's dtype as the RMSNorm kernel stores it
            xf = x.to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=2) / HEAD_DIM + norm_eps)
            x = (xf * rstd[:, :, None] * norm_w).to(x.dtype)
        if IS_NEOX:
            # the partner read touches the same cache lines as x: both loads stay coalesced
            partner_ptrs = x_ptr + x_rows + head_offs + partner[None, None, :]
            x_partner = tl.load(partner_ptrs, mask=row_mask & (dims < ROT_DIM), other=0.0)
            if QK_NORM:  # the partner's own weight, its head's rstd
                x_partner = (x_partner.to(tl.float32) * rstd[:, :, None] * norm_w_partner).to(x.dtype)
        else:
            # swap neighbours in registers: a load at d ^ 1 is not provably contiguous and runs
            # element by element (3x slower); past ROT_DIM the swapped values meet sin = 0
            even, odd = tl.split(tl.reshape(x, [BLOCK_T, BLOCK_HEADS, BLOCK_D // 2, 2]))
            x_partner = tl.reshape(tl.join(odd, even), [BLOCK_T, BLOCK_HEADS, BLOCK_D])
        out = (x.to(tl.float32) * cos + x_partner.to(tl.float32) * signed_sin).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + out_rows + head_offs + dims, out, mask=row_mask & (dims < HEAD_DIM))
        if WRITE_CACHE:
            _store_heads(
                cache_ptr, out, cache_rows, heads, row_mask & cache_ok[:, None, None] & (dims < HEAD_DIM),
                cache_stride_head, scale_ptr, QUANTIZE_FP8, FP8_MAX, MANTISSA_BITS, MIN_NORMAL_EXP, BLOCK_D,
            )  # fmt: skip


@triton.jit
def _copy_heads_to_cache(
    x_ptr,  # [num_tokens, num_heads * HEAD_DIM], rows x_row_stride apart, dims contiguous
    x_row_stride,
    num_heads,
    tokens,
    token_mask,
    cache_ptr,
    cache_rows,
    cache_ok,
    cache_stride_head,
    scale_ptr,
    HEAD_DIM: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QUANTIZE_FP8: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MANTISSA_BITS: tl.constexpr,
    MIN_NORMAL_EXP: tl.constexpr,
):
    dims = tl.arange(0, BLOCK_D)[None, None, :]
    x_rows = (tokens * x_row_stride)[:, None, None]
    for head_start in range(0, num_heads, BLOCK_HEADS):
        heads = head_start + tl.arange(0, BLOCK_HEADS)
        mask = (token_mask & cache_ok)[:, None, None] & (heads < num_heads)[None, :, None] & (dims < HEAD_DIM)
        x = tl.load(x_ptr + x_rows + (heads * HEAD_DIM)[None, :, None] + dims, mask=mask, other=0.0)
        _store_heads(
            cache_ptr, x, cache_rows, heads, mask, cache_stride_head, scale_ptr,
            QUANTIZE_FP8, FP8_MAX, MANTISSA_BITS, MIN_NORMAL_EXP, BLOCK_D,
        )  # fmt: skip


@triton.jit
def _rotary_kernel(
    positions_ptr,  # [num_tokens] int32 or int64
    q_ptr,  # [num_tokens, num_q_heads * HEAD_DIM], rows q_row_stride apart
    k_ptr,  # [num_tokens, num_kv_heads * HEAD_DIM], rows k_row_stride apart
    q_out_ptr,  # [num_tokens, num_q_heads * HEAD_DIM] contiguous
    k_out_ptr,  # [num_tokens, num_kv_heads * HEAD_DIM] contiguous
    cache_ptr,  # [max_position, ROT_DIM] contiguous: cos in the first ROT_DIM/2 columns, sin after
    # WRITE_CACHE only (else None / 0): v [num_tokens, num_kv_heads * HEAD_DIM] rows v_row_stride apart,
    # the paged caches [num_blocks, CACHE_BLOCK_SIZE, num_kv_heads, HEAD_DIM], slots (< 0: skip), scales
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    k_scale_ptr,
    v_scale_ptr,
    num_tokens,
    num_q_heads,
    num_kv_heads,
    q_row_stride,
    k_row_stride,
    v_row_stride,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    q_norm_weight_ptr,  # QK_NORM only (else None): [HEAD_DIM] each
    k_norm_weight_ptr,
    norm_eps,
    HEAD_DIM: tl.constexpr,
    ROT_DIM: tl.constexpr,
    IS_NEOX: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WRITE_CACHE: tl.constexpr,
    CACHE_BLOCK_SIZE: tl.constexpr,
    QUANTIZE_FP8: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MANTISSA_BITS: tl.constexpr,
    MIN_NORMAL_EXP: tl.constexpr,
    QK_NORM: tl.constexpr,
    PDL: tl.constexpr = False,
):
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
    axis = tl.program_id(1)
    # Before the PDL wait: the step's inputs (positions, cache slots: written when the step began, at least three
    # launches back, so done once the previous kernel may let this one start; read past L1) and the constant
    # cos / sin table, whose two dependent loads then stream under the previous kernel's tail. q, k and v (the
    # previous kernel's output) are read after the wait.
    # the token's cache slot (WRITE_CACHE): slots < 0 are skipped, clamped so masked addresses stay in range
    cache_ok = token_mask
    k_rows = tokens
    if WRITE_CACHE:  # (a constexpr: without the cache, v's pointers are None and its copy must not compile)
        slots = tl.load(slot_mapping_ptr + tokens, mask=token_mask, other=-1, cache_modifier=".cg").to(tl.int64)
        cache_ok = token_mask & (slots >= 0)
        slots = tl.maximum(slots, 0)
        blocks, offsets = slots // CACHE_BLOCK_SIZE, slots % CACHE_BLOCK_SIZE
        k_rows = blocks * stride_kc_block + offsets * stride_kc_slot
        v_rows = blocks * stride_vc_block + offsets * stride_vc_slot
    rotated = token_mask & (tl.full([BLOCK_T], 0, tl.int32) + axis < 2)  # q (axis 0), k (1); v (2): copied
    positions = tl.load(positions_ptr + tokens, mask=rotated, other=0, cache_modifier=".cg").to(tl.int64)
    cs_offs = (positions * ROT_DIM)[:, None] + freq[None, :]
    cs_mask = rotated[:, None] & (dims < ROT_DIM)[None, :]
    cos = tl.load(cache_ptr + cs_offs, mask=cs_mask, other=1.0).to(tl.float32)
    sin = tl.load(cache_ptr + cs_offs + HALF, mask=cs_mask, other=0.0).to(tl.float32)
    pdl_wait(PDL)
    if WRITE_CACHE:
        if axis == 2:  # V: copied, never rotated
            _copy_heads_to_cache(
                v_ptr, v_row_stride, num_kv_heads, tokens, token_mask, v_cache_ptr, v_rows, cache_ok, stride_vc_head,
                v_scale_ptr, HEAD_DIM, BLOCK_HEADS, BLOCK_D, QUANTIZE_FP8, FP8_MAX, MANTISSA_BITS, MIN_NORMAL_EXP,
            )  # fmt: skip
    if axis < 2:
        signed_sin = tl.where(first[None, :], -sin, sin)[:, None, :]
        cos_heads = cos[:, None, :]
        if axis == 0:
            _rotate_heads(
                q_ptr, q_out_ptr, q_row_stride, num_q_heads, tokens, token_mask, partner, cos_heads, signed_sin,
                k_cache_ptr, k_rows, cache_ok, stride_kc_head, k_scale_ptr, q_norm_weight_ptr, norm_eps,
                HEAD_DIM, ROT_DIM, IS_NEOX, BLOCK_T, BLOCK_HEADS, BLOCK_D, False, QUANTIZE_FP8, FP8_MAX,
                MANTISSA_BITS, MIN_NORMAL_EXP, QK_NORM,
            )  # fmt: skip
        else:
            _rotate_heads(
                k_ptr, k_out_ptr, k_row_stride, num_kv_heads, tokens, token_mask, partner, cos_heads, signed_sin,
                k_cache_ptr, k_rows, cache_ok, stride_kc_head, k_scale_ptr, k_norm_weight_ptr, norm_eps,
                HEAD_DIM, ROT_DIM, IS_NEOX, BLOCK_T, BLOCK_HEADS, BLOCK_D, WRITE_CACHE, QUANTIZE_FP8, FP8_MAX,
                MANTISSA_BITS, MIN_NORMAL_EXP, QK_NORM,
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
    return _rotate(positions, q, k, cos_sin_cache, head_dim, is_neox, None, None)


@register("rope_kv_write", "triton", supports=KV_WRITE_SUPPORTS, priority=10)
def rotary_write_kv_cache(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_dim: int,
    is_neox: bool,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rotary_embedding(positions, q, k, ...) and write_kv_cache(rotated k, v, k_cache, v_cache,
    slot_mapping, k_scale=, v_scale=) in one launch: v [num_tokens, num_kv_heads * head_dim] (rows may
    be strided); the caches and slots as kv_cache_write.write_kv_cache takes them. Returns the rotated
    (q, k); the cache holds the rotated k as the model's dtype rounds it (then quantized for FP8).
    qk_norm (q_weight, k_weight, eps), weights [head_dim]: each head of q and k RMS-normalised first
    (Qwen3), rounded to q's dtype as rms_norm stores it."""
    quantize = check_kv_scales(k_cache, v_cache, k_scale, v_scale, "rotary_write_kv_cache")
    if qk_norm is not None and (qk_norm[0].shape != (head_dim,) or qk_norm[1].shape != (head_dim,)):
        raise ValueError(
            f"rotary_write_kv_cache: qk_norm weights must be [{head_dim}] (got {tuple(qk_norm[0].shape)}, "
            f"{tuple(qk_norm[1].shape)})"
        )
    cache_write = (v, k_cache, v_cache, slot_mapping, k_scale, v_scale, quantize)
    return _rotate(positions, q, k, cos_sin_cache, head_dim, is_neox, cache_write, qk_norm)


def _rotate(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_dim: int,
    is_neox: bool,
    cache_write: tuple | None,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
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
    if cache_write is None:
        v2 = k_cache = v_cache = slot_mapping = k_scale = v_scale = None
        quantize, v_row_stride, cache_strides, cache_block_size = False, 0, (0,) * 6, 1
    else:
        v, k_cache, v_cache, slot_mapping, k_scale, v_scale, quantize = cache_write
        v2 = _as_token_rows(v, num_tokens)
        if v2.shape[1] != k2.shape[1]:
            raise ValueError(f"rotary_write_kv_cache: v width {v2.shape[1]} differs from k width {k2.shape[1]}")
        expected = (num_kv_heads, head_dim)
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            if t.dim() != 4 or tuple(t.shape[2:]) != expected or t.stride(-1) != 1:
                raise ValueError(
                    f"rotary_write_kv_cache: {name} must be [num_blocks, block_size, {num_kv_heads}, {head_dim}] with "
                    f"contiguous dims (got shape {tuple(t.shape)}, strides {t.stride()})"
                )
        if not quantize:
            k_scale = v_scale = None  # not read: the key's None pointers say so
        v_row_stride, cache_strides, cache_block_size = (
            v2.stride(0),
            (*k_cache.stride()[:3], *v_cache.stride()[:3]),
            k_cache.shape[1],
        )
    fp8_max, mantissa_bits, min_normal_exp = fp8_grid_params(k_cache.dtype) if quantize else (0.0, 0, 0)
    q_norm_weight, k_norm_weight, norm_eps = (None, None, 0.0) if qk_norm is None else qk_norm
    args = (
        positions, q2, k2, q_out, k_out, cache, v2, k_cache, v_cache, slot_mapping, k_scale, v_scale,
        num_tokens, num_q_heads, num_kv_heads, q_row_stride, k_row_stride, v_row_stride, *cache_strides,
        q_norm_weight, k_norm_weight, float(norm_eps),
    )  # fmt: skip
    constexprs = dict(
        HEAD_DIM=head_dim, ROT_DIM=rot_dim, IS_NEOX=is_neox, BLOCK_T=block_t, BLOCK_HEADS=block_heads, BLOCK_D=block_d,
        WRITE_CACHE=cache_write is not None, CACHE_BLOCK_SIZE=cache_block_size, QUANTIZE_FP8=quantize,
        FP8_MAX=fp8_max, MANTISSA_BITS=mantissa_bits, MIN_NORMAL_EXP=min_normal_exp, QK_NORM=qk_norm is not None,
    )  # fmt: skip
    device_index = q.device.index or 0
    # the output and cache dtypes follow from the inputs'; all but num_tokens are fixed by the model and
    # the cache: raw values (None pointers: the WRITE_CACHE and QUANTIZE_FP8 constexprs say which)
    key = (
        positions.dtype, q.dtype, k.dtype, cache.dtype, None if k_cache is None else k_cache.dtype,
        None if slot_mapping is None else slot_mapping.dtype,
        None if q_norm_weight is None else q_norm_weight.dtype,
        aligned(positions, q2, k2, q_out, k_out, cache, v2, k_cache, v_cache, slot_mapping, k_scale, v_scale,
                q_norm_weight, k_norm_weight),
        int_spec(num_tokens), num_q_heads, num_kv_heads, q_row_stride, k_row_stride, v_row_stride, cache_strides,
    )  # fmt: skip
    _ROTARY(
        key, (triton.cdiv(num_tokens, block_t), 2 if cache_write is None else 3), args, constexprs,
        num_warps=num_warps, num_stages=DEFAULT_NUM_STAGES, device_index=device_index,
    )  # fmt: skip
    return q_out, k_out
