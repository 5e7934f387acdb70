"""Dequantize-then-GEMM, the GEMM family's path for decoded weights (int4, 8-bit grouped, MXFP4) at
large M: one pass writes the weight in the activations' dtype, then the float GEMM (its own table:
the persistent descriptor kernel on Hopper) runs at full tensor-core rate. At large M the fused
kernel decodes each weight tile once per row of output tiles (M / BLOCK_M times), which costs more
than one decode pass plus the float weight read (N * K * 2.5 bytes for int4)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonllm.kernels.gemm_scales import (
    DEC_FP4,
    DEC_INT4,
    dequant_values,
    e2m1_to_float,
    e8m0_to_float,
    small_uint_to_float,
    unpack_values,
)


@triton.jit
def dequant_kernel(
    b_ptr, scale_ptr, zero_ptr, out_ptr, N, K, stride_bn, stride_bk, stride_sn, stride_sk, stride_on,
    DECODE: tl.constexpr, GROUP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.program_id(1) * BLOCK_K
    rn = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    PACK: tl.constexpr = 2 if (DECODE == DEC_INT4 or DECODE == DEC_FP4) else 1
    offs_kb = k // PACK + tl.arange(0, BLOCK_K // PACK)
    b = tl.load(b_ptr + rn[:, None] * stride_bn + offs_kb[None, :] * stride_bk,
                mask=(offs_kb < K // PACK)[None, :], other=0)  # fmt: skip
    w = unpack_values(b, DECODE, BLOCK_K, BLOCK_N, 0)
    w = dequant_values(w, scale_ptr, zero_ptr, rn, k, K, stride_sn, stride_sk, DECODE, GROUP_K, BLOCK_K, BLOCK_N, 0, 1)
    offs_k = k + tl.arange(0, BLOCK_K)
    mask = (offs_n < N)[:, None] & (offs_k < K)[None, :]
    out = out_ptr + offs_n[:, None].to(tl.int64) * stride_on + offs_k[None, :]
    tl.store(out, w.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def dequant_words_kernel(
    w_ptr, scale_ptr, zero_ptr, out_ptr, N, K, stride_wn, stride_sn, stride_sk, stride_on,
    FP4: tl.constexpr, GROUP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    """dequant_kernel for 4-bit weights read as int32 words (nibble j of word w is column 8 w + j, as the bytes
    store them): a program's values stay [BLOCK_N, BLOCK_W, 8], a word's eight columns in one thread, so they are
    stored as it decodes them (one 16-byte store a word) instead of being interleaved back into K order through
    shared memory, and each K group's scale (and zero point) is loaded once and broadcast over its words. Same
    arithmetic as dequant_values, so the same bits. Tiles hold whole groups (BLOCK_W * 8 a multiple of GROUP_K)
    or lie inside one (GROUP_K a multiple of BLOCK_W * 8)."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    rn = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    in_k = offs_w < K // 8
    words = tl.load(w_ptr + rn[:, None] * stride_wn + offs_w[None, :], mask=in_k[None, :], other=0)
    j = tl.arange(0, 8)
    q = (words[:, :, None] >> (4 * j)[None, None, :]) & 0xF
    if BLOCK_W * 8 >= GROUP_K:  # whole groups: each group's values loaded once, spread over its words
        G: tl.constexpr = BLOCK_W * 8 // GROUP_K
        gi = tl.program_id(1) * G + tl.arange(0, G)
        g_ptrs = rn[:, None] * stride_sn + gi[None, :] * stride_sk
        g_mask = (gi * GROUP_K < K)[None, :]
        s = tl.load(scale_ptr + g_ptrs, mask=g_mask, other=0)
        s = tl.reshape(tl.broadcast_to(s[:, :, None], (BLOCK_N, G, GROUP_K // 8)), (BLOCK_N, BLOCK_W))
        if not FP4:
            z = tl.load(zero_ptr + g_ptrs, mask=g_mask, other=0)
            z = tl.reshape(tl.broadcast_to(z[:, :, None], (BLOCK_N, G, GROUP_K // 8)), (BLOCK_N, BLOCK_W))
    else:  # inside one group: one value a row
        group = tl.program_id(1) * BLOCK_W * 8 // GROUP_K
        s = tl.load(scale_ptr + rn * stride_sn + group * stride_sk)[:, None]
        if not FP4:
            z = tl.load(zero_ptr + rn * stride_sn + group * stride_sk)[:, None]
    if FP4:
        w = e2m1_to_float(q) * e8m0_to_float(s)[:, :, None]
    else:
        w = (small_uint_to_float(q) - z.to(tl.float32)[:, :, None]) * s.to(tl.float32)[:, :, None]
    cols = offs_w[:, None] * 8 + j[None, :]
    out = out_ptr + offs_n[:, None, None].to(tl.int64) * stride_on + cols[None, :, :]
    tl.store(out, w.to(out_ptr.dtype.element_ty), mask=(offs_n < N)[:, None, None] & in_k[None, :, None])


# (rows, columns, warps) of a program's tile; experiments/quant4/dequant/sweep.py sets others to time them
TILES = (64, 256, 4)
# 4-bit weights through dequant_words_kernel (where their words and groups allow it) instead of dequant_kernel:
# off until timed (sm90 SASS of the 64 x 256 int4 tile, Triton 3.6: 928 instructions a thread against 1,288, 40
# registers against 72, 7 barriers against 35); the sweep times both
WORDS = False


def _words_take(b: torch.Tensor, k: int, decode: int, group_k: int, block_k: int) -> bool:
    """Whether dequant_words_kernel serves this weight: 4-bit pairs viewable as int32 words (K a multiple of 8,
    rows 4-byte aligned) with groups of whole words that whole tiles hold, or that hold whole tiles."""
    return (
        decode in (DEC_INT4, DEC_FP4) and k % 8 == 0 and group_k % 8 == 0 and b.stride(1) == 1
        and b.stride(0) % 4 == 0 and b.data_ptr() % 4 == 0 and (block_k % group_k == 0 or group_k % block_k == 0)
    )  # fmt: skip


def dequantize(
    b: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, k: int, decode: int, group_k: int,
    dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """The [N, K] weight in `dtype` that packed/8-bit `b` with its group scales (and zero points)
    stands for (gemm()'s b_decode layouts)."""
    n = b.shape[0]
    out = torch.empty((n, k), dtype=dtype, device=b.device)
    # tiles of whole groups, or inside one group; a group that is all of K and no power of two (one
    # group per row) takes tiles no wider than it. 64 x 256 tiles: on the H200 Llama-3-8B's gate_up
    # (28672 x 4096) int4 in 89 us against 97 for 32 x 128, o_proj MXFP4 in 23 against 43 (session 20)
    block_n, block_k, warps = TILES
    if group_k & (group_k - 1):
        block_k = max(16, min(128, 1 << (group_k.bit_length() - 1)))
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, block_k))
    if WORDS and _words_take(b, k, decode, group_k, block_k):
        dequant_words_kernel[grid](
            b.view(torch.int32), scale, zero if zero is not None else scale, out, n, k, b.stride(0) // 4,
            scale.stride(0), scale.stride(1), out.stride(0),
            FP4=bool(decode == DEC_FP4), GROUP_K=group_k, BLOCK_N=block_n, BLOCK_W=block_k // 8, num_warps=warps,
        )  # fmt: skip
        return out
    dequant_kernel[grid](
        b, scale, zero if zero is not None else scale, out, n, k, b.stride(0), b.stride(1),
        scale.stride(0), scale.stride(1), out.stride(0),
        DECODE=decode, GROUP_K=group_k, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
    )  # fmt: skip
    return out
