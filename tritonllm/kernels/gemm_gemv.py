"""The GEMV member of the GEMM family (kernels/gemm.py), for decode-sized M (a few rows).

At M = 1-4 a tensor-core tile pads the rows to 16 and stages the weight through shared memory,
while the weight read is the whole cost. Here each program takes one activation row and BLOCK_N
weight rows: the weight tile is loaded straight into registers (K contiguous, wide loads), widened
to float32 (int32 for int8 W8A8), multiplied by the row and summed along K. Programs of the same
weight tile and different rows are adjacent in the grid, so the weight is read from HBM once and
from L2 by the others. Same operands and scales as `gemm_kernel`: row/column scales in the epilogue,
K-grouped float32 scales (block-FP8) per K tile (BLOCK_K divides the group), weight-only,
e4m3fn-bytes and decoded (int4, 8-bit grouped, MXFP4) weights; the epilogue is the GEMM kernel's
(gemm_scales.epilogue), K splits writing float32 partials that gemm.py's reduce kernel sums. A tile
table entry asks for it with `GemmTiles(gemv=True)` (block_m unused). Packed 4-bit weights (int4, MXFP4)
that can be read as int32 words take kernels/gemv_w4.py instead; this kernel keeps the rest.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tritonllm.kernels.gemm_scales import (
    DEC_FP4,
    DEC_INT4,
    DEC_NONE,
    e4m3fn_bits_to_float,
    epilogue,
    gemv_decoded_part,
    group_scales,
)
from tritonllm.kernels.launch import pdl_wait


@triton.jit
def gemv_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, b_zero_ptr, ws_ptr,
    M, N, K, K_PER_SPLIT,
    stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
    stride_asm, stride_ask, stride_bsn, stride_bsk,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr,
    INT_ACC: tl.constexpr, HAS_BIAS: tl.constexpr, B_E4M3FN_BITS: tl.constexpr, B_DECODE: tl.constexpr,
    EVEN_K: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_wait(PDL)
    pid = tl.program_id(0)
    row = pid % M  # rows of one weight tile are neighbours: one HBM read, the rest from L2
    pid_n = pid // M
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    rm = tl.full([1], row, tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    PACK: tl.constexpr = 2 if (B_DECODE == DEC_INT4 or B_DECODE == DEC_FP4) else 1  # K values per byte of B
    offs_kb = tl.arange(0, BLOCK_K // PACK)
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(K, k_start + K_PER_SPLIT)
    K_GROUPED: tl.constexpr = (A_SCALE == 3 or B_SCALE == 3) and B_DECODE == DEC_NONE
    a_ptrs = a_ptr + row.to(tl.int64) * stride_am + (k_start + offs_k) * stride_ak
    b_ptrs = b_ptr + rn[:, None] * stride_bn + (k_start // PACK + offs_kb)[None, :] * stride_bk
    if INT_ACC:
        acc = tl.zeros((BLOCK_N,), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        if EVEN_K:
            b = tl.load(b_ptrs)
        else:
            b = tl.load(b_ptrs, mask=(k // PACK + offs_kb < k_end // PACK)[None, :], other=0.0)
        if B_DECODE != DEC_NONE:  # int4 / 8-bit with group scales and zero points, or MXFP4
            acc += gemv_decoded_part(b, a_ptr + row.to(tl.int64) * stride_am, b_scale_ptr, b_zero_ptr, rn, k, k_end,
                                     stride_ak, stride_bsn, stride_bsk, B_DECODE, GROUP_K, BLOCK_K, BLOCK_N)  # fmt: skip
        else:
            if EVEN_K:
                a = tl.load(a_ptrs)
            else:
                a = tl.load(a_ptrs, mask=k + offs_k < k_end, other=0.0)
            if INT_ACC:
                acc += tl.sum(b.to(tl.int32) * a.to(tl.int32)[None, :], axis=1)
            else:
                if B_E4M3FN_BITS:
                    b = e4m3fn_bits_to_float(b)
                part = tl.sum(b.to(tl.float32) * a.to(tl.float32)[None, :], axis=1)
                if K_GROUPED:
                    a_s, b_s = group_scales(a_scale_ptr, b_scale_ptr, rm, rn, k // GROUP_K, stride_asm, stride_ask,
                                            stride_bsn, stride_bsk, A_SCALE, B_SCALE, GROUP_N, False)  # fmt: skip
                    part = part * a_s * b_s
                acc += part
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += (BLOCK_K // PACK) * stride_bk

    epilogue(acc[None, :], c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, ws_ptr, rm, offs_n, rm, rn, M, N, pid_k,
             stride_cm, stride_cn, stride_asm, stride_bsn, A_SCALE, B_SCALE, HAS_BIAS, SPLIT_K)  # fmt: skip
