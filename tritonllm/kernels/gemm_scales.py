"""Scale, weight-decoding and epilogue helpers shared by the GEMM family's kernels (gemm.py, gemm_gemv.py)."""

from __future__ import annotations

import triton
import triton.language as tl

from tritonllm import platform  # noqa: F401  (switches on the interpreter on CPU first)


@triton.jit
def e8m0_to_float(e):
    return tl.exp2(e.to(tl.float32) - 127.0)


@triton.jit
def e4m3fn_bits_to_float(bits):
    """e4m3fn bytes (uint8) -> float32 with integer arithmetic, for GPUs without FP8 conversions:
    normals (1 + m/8) * 2**(e - 7) rebuilt as float32 bits, subnormals m * 2**-9 (NaN not decoded)."""
    x = bits.to(tl.int32)
    e = (x >> 3) & 0xF
    m = x & 0x7
    normal = (((x & 0x80) << 24) | ((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    subnormal = m.to(tl.float32) * 0.001953125
    return tl.where(e == 0, tl.where((x & 0x80) != 0, -subnormal, subnormal), normal)


@triton.jit
def group_scales(a_scale_ptr, b_scale_ptr, rm, rn, group, stride_asm, stride_ask, stride_bsn, stride_bsk,
                 A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_N: tl.constexpr, E8M0: tl.constexpr):  # fmt: skip
    """K group `group`'s scales of rows rm (A) and columns rn (B) as float32; ones where a side has none."""
    a_s = tl.full(rm.shape, 1.0, tl.float32)
    b_s = tl.full(rn.shape, 1.0, tl.float32)
    if A_SCALE == 3:
        a_s = tl.load(a_scale_ptr + rm * stride_asm + group * stride_ask)
        a_s = e8m0_to_float(a_s) if E8M0 else a_s.to(tl.float32)
    if B_SCALE == 3:
        b_s = tl.load(b_scale_ptr + (rn // GROUP_N) * stride_bsn + group * stride_bsk)
        b_s = e8m0_to_float(b_s) if E8M0 else b_s.to(tl.float32)
    return a_s, b_s


# How a weight-only B tile is decoded before the dot (gemm()'s `b_decode`; quant_formats.py's layouts)
DEC_NONE = tl.constexpr(0)  # stored in a float/FP8/int8 dtype: widened as it is
DEC_INT4 = tl.constexpr(1)  # uint8 pairs [N, K / 2] (even column in the low nibble): (q - zero) * scale per group
DEC_UINT8 = tl.constexpr(2)  # uint8 [N, K]: (q - zero) * scale per group (8-bit GPTQ, GGUF 5-8-bit types)
DEC_FP4 = tl.constexpr(3)  # e2m1 pairs [N, K / 2] with one e8m0 scale per 32 along K (MXFP4)


@triton.jit
def e2m1_to_float(x):
    """OCP e2m1 codes (0..15: sign, two exponent bits, one mantissa bit) -> float32: 0, 0.5, 1, 1.5,
    2, 3, 4, 6 and their negatives, in integer operations only (no int-to-float conversion, a
    quarter-rate instruction on NVIDIA GPUs): a magnitude code c >= 2 is the float32 with bits
    (c << 22) + 0x3F000000 (exponent (c >> 1) + 126, mantissa bit c & 1), c = 1 is 0.5 (0x3F000000)."""
    x = x.to(tl.int32)
    c = x & 7
    bits = tl.where(c >= 2, (c << 22) + 0x3F000000, tl.where(c == 1, 0x3F000000, 0))
    return (bits | ((x & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def small_uint_to_float(q):
    """Integers 0..2**23 - 1 -> float32 without an int-to-float conversion: the bits 0x4B000000 | q
    are the float 2**23 + q, from which 2**23 is subtracted (one OR and one FADD, both full rate)."""
    return (q.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def nibble_values(b, DECODE: tl.constexpr):
    """Packed bytes -> (low-nibble values, high-nibble values) as float32: int4 codes 0..15, or
    e2m1 values (MXFP4). The low nibble holds the even K column, the high nibble the odd one."""
    lo = b & 0xF
    hi = b >> 4
    if DECODE == DEC_FP4:
        return e2m1_to_float(lo), e2m1_to_float(hi)
    return small_uint_to_float(lo), small_uint_to_float(hi)


@triton.jit
def unpack_values(b, DECODE: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, N_AXIS: tl.constexpr):
    """A loaded weight tile -> its values (codes, or e2m1 values) as float32 in K order:
    [BLOCK_K, BLOCK_N] (N_AXIS 1) or [BLOCK_N, BLOCK_K] (N_AXIS 0); packed bytes' nibble halves are
    interleaved back (even column from the low nibble)."""
    if DECODE == DEC_UINT8:
        v = small_uint_to_float(b)
    else:  # (one return: Triton types every return of a function alike, constexpr branches included)
        lo, hi = nibble_values(b, DECODE)
        if N_AXIS == 1:
            v = tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (BLOCK_K, BLOCK_N))
        else:
            v = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))
    return v


@triton.jit
def group_values(ptr, rn, k, K, stride_sn, stride_sk, other,
                 GROUP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, N_AXIS: tl.constexpr,
                 PACK: tl.constexpr):  # fmt: skip
    """The per-(column, K-group) values (scales, zero points) of the K tile starting at k, spread over
    a tile of BLOCK_K / PACK K rows (packed bytes hold PACK columns of one group): [BLOCK_K / PACK,
    BLOCK_N] (N_AXIS 1) or [BLOCK_N, BLOCK_K / PACK] (N_AXIS 0). A tile of several groups loads each
    group's value once and broadcasts it; a tile inside one group loads one per column, [1, BLOCK_N]
    or [BLOCK_N, 1], broadcast by the caller's arithmetic."""
    if BLOCK_K > GROUP_K:
        GROUPS: tl.constexpr = BLOCK_K // GROUP_K
        ROWS: tl.constexpr = GROUP_K // PACK
        gi = k // GROUP_K + tl.arange(0, GROUPS)
        in_k = gi * GROUP_K < K
        if N_AXIS == 1:
            v = tl.load(ptr + gi[:, None] * stride_sk + rn[None, :] * stride_sn, mask=in_k[:, None], other=other)
            v = tl.reshape(tl.broadcast_to(v[:, None, :], (GROUPS, ROWS, BLOCK_N)), (BLOCK_K // PACK, BLOCK_N))
        else:
            v = tl.load(ptr + rn[:, None] * stride_sn + gi[None, :] * stride_sk, mask=in_k[None, :], other=other)
            v = tl.reshape(tl.broadcast_to(v[:, :, None], (BLOCK_N, GROUPS, ROWS)), (BLOCK_N, BLOCK_K // PACK))
    else:
        v = tl.load(ptr + rn * stride_sn + (k // GROUP_K) * stride_sk)
        v = v[None, :] if N_AXIS == 1 else v[:, None]
    return v


@triton.jit
def dequant_values(v, scale_ptr, zero_ptr, rn, k, K, stride_sn, stride_sk,
                   DECODE: tl.constexpr, GROUP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
                   N_AXIS: tl.constexpr, PACK: tl.constexpr):  # fmt: skip
    """Decoded values v (float32 codes or e2m1 values; a tile of BLOCK_K / PACK K rows, nibble halves
    of packed weights) -> the weights: (v - zero) * scale per group, or v * 2 ** (e - 127) (MXFP4)."""
    s = group_values(scale_ptr, rn, k, K, stride_sn, stride_sk, 0, GROUP_K, BLOCK_K, BLOCK_N, N_AXIS, PACK)
    if DECODE == DEC_FP4:
        return v * e8m0_to_float(s)
    z = group_values(zero_ptr, rn, k, K, stride_sn, stride_sk, 0, GROUP_K, BLOCK_K, BLOCK_N, N_AXIS, PACK)
    return (v - z.to(tl.float32)) * s.to(tl.float32)


@triton.jit
def gemv_decoded_part(b, a_ptr, scale_ptr, zero_ptr, rn, k, k_end, stride_ak, stride_sn, stride_sk,
                      DECODE: tl.constexpr, GROUP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """One K tile of a decoded weight's GEMV: sum over k of w[n, k] * a[k] for the BLOCK_N rows rn, b
    the tile as loaded ([BLOCK_N, BLOCK_K / pack]) and a_ptr the activation row at column 0. Packed
    weights are not interleaved back into K order: the activation is read as its even and odd columns,
    each multiplied by one nibble half. Scales and zero points are factored out of each group's sum,
    sum_k (q_k - z) s a_k = s (sum_k q_k a_k - z sum_k a_k), so no scale is spread over the tile."""
    PACK: tl.constexpr = 2 if (DECODE == DEC_INT4 or DECODE == DEC_FP4) else 1
    offs = tl.arange(0, BLOCK_K // PACK)
    in_k = k + PACK * offs < k_end
    if PACK == 2:
        a_lo = tl.load(a_ptr + (k + 2 * offs) * stride_ak, mask=in_k, other=0.0).to(tl.float32)
        a_hi = tl.load(a_ptr + (k + 2 * offs + 1) * stride_ak, mask=in_k, other=0.0).to(tl.float32)
        lo, hi = nibble_values(b, DECODE)
        prod = lo * a_lo[None, :] + hi * a_hi[None, :]
        a_sum = a_lo + a_hi
    else:
        a_k = tl.load(a_ptr + (k + offs) * stride_ak, mask=in_k, other=0.0).to(tl.float32)
        prod = small_uint_to_float(b) * a_k[None, :]
        a_sum = a_k
    if BLOCK_K > GROUP_K:  # several groups a tile: one partial sum per group
        GROUPS: tl.constexpr = BLOCK_K // GROUP_K
        gi = k // GROUP_K + tl.arange(0, GROUPS)
        g_mask = (gi * GROUP_K < k_end)[None, :]
        sums = tl.sum(tl.reshape(prod, (BLOCK_N, GROUPS, GROUP_K // PACK)), axis=2)
        s = tl.load(scale_ptr + rn[:, None] * stride_sn + gi[None, :] * stride_sk, mask=g_mask, other=0)
        if DECODE == DEC_FP4:
            return tl.sum(sums * e8m0_to_float(s), axis=1)
        z = tl.load(zero_ptr + rn[:, None] * stride_sn + gi[None, :] * stride_sk, mask=g_mask, other=0)
        a_sums = tl.sum(tl.reshape(a_sum, (GROUPS, GROUP_K // PACK)), axis=1)
        return tl.sum((sums - z.to(tl.float32) * a_sums[None, :]) * s.to(tl.float32), axis=1)
    total = tl.sum(prod, axis=1)
    s = tl.load(scale_ptr + rn * stride_sn + (k // GROUP_K) * stride_sk)
    if DECODE == DEC_FP4:
        return total * e8m0_to_float(s)
    z = tl.load(zero_ptr + rn * stride_sn + (k // GROUP_K) * stride_sk)
    return (total - z.to(tl.float32) * tl.sum(a_sum, axis=0)) * s.to(tl.float32)


@triton.jit
def epilogue(acc, c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, ws_ptr, offs_m, offs_n, rm, rn, M, N, pid_k,
             stride_cm, stride_cn, stride_asm, stride_bsn,
             A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):  # fmt: skip
    """The GEMM and GEMV kernels' end of a [rows, BLOCK_N] tile: row/column scales (1 static, 2 per
    row; 2 per column), then bias and the store in c's dtype, or, with K splits, the float32 partial
    into the workspace [SPLIT_K, M, N] (bias added by the reduce kernel)."""
    out = acc.to(tl.float32)
    if A_SCALE == 1:
        out = out * tl.load(a_scale_ptr)
    if A_SCALE == 2:
        out = out * tl.load(a_scale_ptr + rm * stride_asm)[:, None]
    if B_SCALE == 2:
        out = out * tl.load(b_scale_ptr + rn * stride_bsn)[None, :]
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            out += tl.load(bias_ptr + rn)[None, :].to(tl.float32)
        c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        ws_ptrs = ws_ptr + (pid_k * M + offs_m[:, None]).to(tl.int64) * N + offs_n[None, :]
        tl.store(ws_ptrs, out, mask=mask)
