"""RoPE and the step's K/V cache write folded into split-KV decode (attention_split.split_kv_decode_kernel's ROPE).

A decode layer ran rope_kv_write (kernels/rotary.py: q and k rotated, the new K and V into the cache) and then the
split-KV kernel, which waited for it under PDL: at batch 1 a launch, a hand-off and a round trip through memory a
layer for a few hundred multiply-adds (sessions 25 / 47 step timelines: 1.4-1.9 us exposed a layer). Folded, every
program of the split kernel normalises and rotates its KV head's query rows itself (GROUP rows of HEAD_DIM), and the
program whose segment holds the sequence's newest key normalises and rotates that key, writes it and its value
into the caches, and reads them back with the other keys of its tile after a CTA barrier. Values as rope_kv_write
stores them: the per-head RMSNorm first (QK_NORM: Qwen3's q_norm / k_norm), the rotation in float32, rounded to the
model's dtype; FP8 caches quantize the rounded key and value as kv_cache_write does.

Rotation pairs (ROPE): 1 NeoX (d, d + ROT_DIM / 2), 2 GPT-J (2i, 2i + 1); dims from ROT_DIM on pass unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tritonllm import platform  # noqa: F401  (switches on the interpreter on CPU first)
from tritonllm.kernels.kv_cache_write import _quantize_fp8, fp8_grid_params
from tritonllm.kernels.launch import aligned


@dataclass(frozen=True)
class FoldedRope:
    """What the split-KV kernel needs to rotate q itself and write this step's K/V (AttentionPlan.run's `rope`):
    q is then given unrotated. k, v [num_tokens, num_kv_heads * head_dim] (rows may be strided, dims contiguous):
    the step's keys (not yet rotated) and values; slot_mapping [num_tokens] their cache slots (< 0: not written);
    positions [num_tokens]; cos_sin_cache [max_position, rot_dim] (cos in the first rot_dim / 2 columns, sin
    after); qk_norm (q weight, k weight, eps): each head RMS-normalised first."""

    positions: torch.Tensor
    cos_sin_cache: torch.Tensor
    is_neox: bool
    k: torch.Tensor
    v: torch.Tensor
    slot_mapping: torch.Tensor
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None

    def check(self, num_tokens: int, num_kv_heads: int, head_dim: int) -> None:
        """A clear error for operands the kernel cannot read as given."""
        rot_dim = self.cos_sin_cache.shape[-1]
        if rot_dim > head_dim or rot_dim % 2 or not self.cos_sin_cache.is_contiguous():
            raise ValueError(f"folded RoPE: cos_sin_cache {tuple(self.cos_sin_cache.shape)} must be contiguous with an "
                             f"even rotary dim of at most head_dim {head_dim}")  # fmt: skip
        width = num_kv_heads * head_dim
        for name, t in (("k", self.k), ("v", self.v)):
            if t.dim() != 2 or tuple(t.shape) != (num_tokens, width) or t.stride(1) != 1:
                raise ValueError(f"folded RoPE: {name} must be [{num_tokens}, {width}] with contiguous dims "
                                 f"(got {tuple(t.shape)}, strides {t.stride()})")  # fmt: skip
        if self.positions.shape != (num_tokens,) or self.slot_mapping.shape != (num_tokens,):
            raise ValueError(f"folded RoPE: positions {tuple(self.positions.shape)} and slot_mapping "
                             f"{tuple(self.slot_mapping.shape)} must be [{num_tokens}]")  # fmt: skip
        if self.qk_norm is not None and any(w.shape != (head_dim,) for w in self.qk_norm[:2]):
            raise ValueError(f"folded RoPE: qk_norm weights must be [{head_dim}]")

    def kind(self) -> int:
        """The kernel's ROPE constexpr."""
        return 1 if self.is_neox else 2


@triton.jit
def rope_table(pos_ptr, cos_sin_ptr, token, has_token, HEAD_DIM: tl.constexpr, ROT_DIM: tl.constexpr,
               ROPE: tl.constexpr):  # fmt: skip
    """(cos, signed sin, partner) [HEAD_DIM] at `token`'s position (none: has_token false): signed sin is -sin on a
    pair's first dim, +sin on its second, 0 from ROT_DIM on (cos 1 there); partner the dim each dim pairs with (NeoX).
    Step inputs and a constant table: read before the PDL wait, past L1."""
    HALF: tl.constexpr = ROT_DIM // 2
    dims = tl.arange(0, HEAD_DIM)
    if ROPE == 1:
        first = dims < HALF
        partner = tl.where(first, dims + HALF, dims - HALF)
        freq = tl.where(first, dims, dims - HALF)
    else:
        first = dims % 2 == 0
        partner = dims
        freq = dims // 2
    in_rot = dims < ROT_DIM
    pos = tl.load(pos_ptr + token, mask=has_token, other=0, cache_modifier=".cg").to(tl.int64)
    cos = tl.load(cos_sin_ptr + pos * ROT_DIM + freq, mask=in_rot, other=1.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * ROT_DIM + freq + HALF, mask=in_rot, other=0.0).to(tl.float32)
    return cos, tl.where(first, -sin, sin), tl.where(in_rot, partner, dims)


@triton.jit
def rotated_rows(ptr, row_offs, rows_ok, cos, signed_sin, partner, norm_ptr, norm_eps, HEAD_DIM: tl.constexpr,
                 ROT_DIM: tl.constexpr, ROPE: tl.constexpr, QK_NORM: tl.constexpr):  # fmt: skip
    """The rows [R, HEAD_DIM] at ptr + row_offs [R] (rows_ok: the real ones; others 0), each RMS-normalised first
    (QK_NORM: weight norm_ptr [HEAD_DIM], rounded to the rows' dtype as rms_norm stores it), then rotated in float32
    and rounded to the rows' dtype (rotary.py's values)."""
    R: tl.constexpr = row_offs.shape[0]
    dims = tl.arange(0, HEAD_DIM)
    x = tl.load(ptr + row_offs[:, None] + dims[None, :], mask=rows_ok[:, None], other=0.0)
    if QK_NORM:
        xf = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / HEAD_DIM + norm_eps)
        x = (xf * rstd[:, None] * tl.load(norm_ptr + dims).to(tl.float32)[None, :]).to(x.dtype)
    if ROPE == 1:  # the partner read touches the same cache lines as x
        x_partner = tl.load(ptr + row_offs[:, None] + partner[None, :], mask=rows_ok[:, None] & (dims < ROT_DIM)[None, :],
                            other=0.0)  # fmt: skip
        if QK_NORM:  # the partner's own weight, its row's rstd
            w_partner = tl.load(norm_ptr + partner).to(tl.float32)
            x_partner = (x_partner.to(tl.float32) * rstd[:, None] * w_partner[None, :]).to(x.dtype)
    else:  # GPT-J: neighbours swapped in registers (past ROT_DIM they meet sin 0)
        even, odd = tl.split(tl.reshape(x, [R, HEAD_DIM // 2, 2]))
        x_partner = tl.reshape(tl.join(odd, even), [R, HEAD_DIM])
    return (x.to(tl.float32) * cos[None, :] + x_partner.to(tl.float32) * signed_sin[None, :]).to(x.dtype)


@triton.jit
def write_newest_kv(k_new_ptr, v_new_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, k_norm_ptr, norm_eps,
                    token, slot, kv_head, stride_kn, stride_vn, stride_kc_block, stride_kc_slot, stride_kc_head,
                    stride_vc_block, stride_vc_slot, stride_vc_head, cos, signed_sin, partner,
                    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, ROT_DIM: tl.constexpr, ROPE: tl.constexpr,
                    QK_NORM: tl.constexpr, KV_SCALED: tl.constexpr, FP8_MAX: tl.constexpr,
                    MANTISSA_BITS: tl.constexpr, MIN_NORMAL_EXP: tl.constexpr):  # fmt: skip
    """`token`'s key of kv_head (normalised and rotated as q) and its value into the caches at `slot` (< 0: not
    written); FP8 caches (KV_SCALED): divided by their scales and rounded onto the FP8 grid (kv_cache_write)."""
    dims = tl.arange(0, HEAD_DIM)
    one = tl.full([1], 0, tl.int64)
    token = token.to(tl.int64)
    k = rotated_rows(k_new_ptr, one + token * stride_kn + kv_head * HEAD_DIM, one == 0, cos, signed_sin, partner,
                     k_norm_ptr, norm_eps, HEAD_DIM, ROT_DIM, ROPE, QK_NORM)  # fmt: skip
    v = tl.load(v_new_ptr + token * stride_vn + kv_head * HEAD_DIM + dims)[None, :]
    if KV_SCALED:
        k = _quantize_fp8(k.to(tl.float32), tl.load(k_scale_ptr), FP8_MAX, MANTISSA_BITS, MIN_NORMAL_EXP)
        v = _quantize_fp8(v.to(tl.float32), tl.load(v_scale_ptr), FP8_MAX, MANTISSA_BITS, MIN_NORMAL_EXP)
    ok = (one + slot) >= 0
    slot = tl.maximum(slot, 0).to(tl.int64)
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    k_dst = k_cache_ptr + block * stride_kc_block + offset * stride_kc_slot + kv_head * stride_kc_head + dims
    v_dst = v_cache_ptr + block * stride_vc_block + offset * stride_vc_slot + kv_head * stride_vc_head + dims
    tl.store(k_dst[None, :], k.to(k_cache_ptr.dtype.element_ty), mask=ok[:, None])
    tl.store(v_dst[None, :], v.to(v_cache_ptr.dtype.element_ty), mask=ok[:, None])


def launch_args(rope: FoldedRope | None, fallback: torch.Tensor) -> tuple:
    """The split kernel's runtime arguments for `rope` (pos_ptr, cos_sin_ptr, k_new_ptr, v_new_ptr, slot_ptr,
    stride_kn, stride_vn, q_norm_ptr, k_norm_ptr, norm_eps); without one, `fallback` stands in for every pointer."""
    if rope is None:
        return (fallback,) * 5 + (0, 0, fallback, fallback, 0.0)
    q_norm, k_norm, eps = rope.qk_norm if rope.qk_norm is not None else (fallback, fallback, 0.0)
    return (rope.positions, rope.cos_sin_cache, rope.k, rope.v, rope.slot_mapping, rope.k.stride(0), rope.v.stride(0),
            q_norm, k_norm, float(eps))  # fmt: skip


def launch_key(rope: FoldedRope | None) -> tuple | None:
    """What Triton specialises on in launch_args (dtypes, strides, alignment), with the constexprs' inputs."""
    if rope is None:
        return None
    tensors = (rope.positions, rope.cos_sin_cache, rope.k, rope.v, rope.slot_mapping)
    norm = None if rope.qk_norm is None else (rope.qk_norm[0].dtype, aligned(*rope.qk_norm[:2]))
    return (tuple(t.dtype for t in tensors), aligned(*tensors), rope.k.stride(0), rope.v.stride(0),
            rope.cos_sin_cache.shape[-1], rope.is_neox, norm)  # fmt: skip


def constexprs(rope: FoldedRope | None, kv_dtype: torch.dtype, kv_scaled: bool) -> dict:
    """The split kernel's ROPE constexprs (in its order)."""
    _, mantissa, min_exp = fp8_grid_params(kv_dtype) if kv_scaled and rope is not None else (0.0, 0, 0)
    return dict(
        ROPE=0 if rope is None else rope.kind(), ROT_DIM=0 if rope is None else rope.cos_sin_cache.shape[-1],
        QK_NORM=rope is not None and rope.qk_norm is not None, MANTISSA_BITS=mantissa, MIN_NORMAL_EXP=min_exp,
    )  # fmt: skip
