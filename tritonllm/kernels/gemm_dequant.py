"""Dequantize-then-GEMM, the GEMM family's path for decoded weights (int4, 8-bit grouped, MXFP4) at
large M: one pass writes the weight in the activations' dtype, then the float GEMM (its own table:
the persistent descriptor kernel on Hopper) runs at full tensor-core rate. At large M the fused
kernel decodes each weight tile once per row of output tiles (M / BLOCK_M times), which costs more
than one decode pass plus the float weight read (N * K * 2.5 bytes for int4)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonllm.kernels.gemm_scales import DEC_FP4, DEC_INT4, dequant_values, unpack_values


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


# (rows, columns, warps) of a program's tile; experiments/quant4/dequant/sweep.py sets others to time them
TILES = (16, 512, 4)


def dequantize(
    b: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, k: int, decode: int, group_k: int,
    dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """The [N, K] weight in `dtype` that packed/8-bit `b` with its group scales (and zero points)
    stands for (gemm()'s b_decode layouts)."""
    n = b.shape[0]
    out = torch.empty((n, k), dtype=dtype, device=b.device)
    # tiles of whole groups, or inside one group; a group that is all of K and no power of two (one
    # group per row) takes tiles no wider than it. 16 x 512 tiles, four warps: on an H100 a Llama-3-8B layer's
    # four passes in 206.0 us (int4 g128) and 209.0 (MXFP4) against 216.4 / 220.7 for session 20's 64 x 256, the
    # best of twelve tiles at every layer or within 1% of it (session 41; experiments/quant4/dequant/sweep.py)
    block_n, block_k, warps = TILES
    if group_k & (group_k - 1):
        block_k = max(16, min(128, 1 << (group_k.bit_length() - 1)))
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, block_k))
    dequant_kernel[grid](
        b, scale, zero if zero is not None else scale, out, n, k, b.stride(0), b.stride(1),
        scale.stride(0), scale.stride(1), out.stride(0),
        DECODE=decode, GROUP_K=group_k, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
    )  # fmt: skip
    return out
