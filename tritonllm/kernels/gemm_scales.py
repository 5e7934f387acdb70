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
    2, 3, 4, 6 and their negatives, rebuilt as float32 bits (exponent bias 1 -> 127)."""
    x = x.to(tl.int32)
    e = (x >> 1) & 3
    m = x & 1
    normal = (((e + 126) << 23) | (m << 22)).to(tl.float32, bitcast=True)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.5, normal)
    return tl.where((x & 8) != 0, -mag, mag)


@triton.jit
def group_values(ptr, rn, k, K, stride_sn, stride_sk, other,
                 GROUP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, N_AXIS: tl.constexpr):  # fmt: skip
    """The per-(column, K-group) values (scales, zero points) of the K tile starting at k, spread over
    the tile: [BLOCK_K, BLOCK_N] (N_AXIS 1) or [BLOCK_N, BLOCK_K] (N_AXIS 0). A tile of several groups
    loads each group's value once and broadcasts it; a tile inside one group loads one per column."""
    if BLOCK_K > GROUP_K:
        GROUPS: tl.constexpr = BLOCK_K // GROUP_K
        gi = k // GROUP_K + tl.arange(0, GROUPS)
        in_k = gi * GROUP_K < K
        if N_AXIS == 1:
            v = tl.load(ptr + gi[:, None] * stride_sk + rn[None, :] * stride_sn, mask=in_k[:, None], other=other)
            v = tl.reshape(tl.broadcast_to(v[:, None, :], (GROUPS, GROUP_K, BLOCK_N)), (BLOCK_K, BLOCK_N))
        else:
            v = tl.load(ptr + rn[:, None] * stride_sn + gi[None, :] * stride_sk, mask=in_k[None, :], other=other)
            v = tl.reshape(tl.broadcast_to(v[:, :, None], (BLOCK_N, GROUPS, GROUP_K)), (BLOCK_N, BLOCK_K))
    else:
        v = tl.load(ptr + rn * stride_sn + (k // GROUP_K) * stride_sk)
        v = v[None, :] if N_AXIS == 1 else v[:, None]
    return v


@triton.jit
def decode_weight(b, scale_ptr, zero_ptr, rn, k, K, stride_sn, stride_sk,
                  DECODE: tl.constexpr, GROUP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
                  N_AXIS: tl.constexpr):  # fmt: skip
    """A loaded weight tile `b` of the K tile starting at k -> float32 values, [BLOCK_K, BLOCK_N] (N_AXIS
    1: b is [BLOCK_K / pack, BLOCK_N]) or [BLOCK_N, BLOCK_K] (N_AXIS 0), per DECODE (DEC_*)."""
    if DECODE == DEC_UINT8:
        q = b
    elif N_AXIS == 1:  # two values a byte along K: interleave low and high nibbles back into K order
        q = tl.reshape(tl.permute(tl.join(b & 0xF, b >> 4), (0, 2, 1)), (BLOCK_K, BLOCK_N))
    else:
        q = tl.reshape(tl.join(b & 0xF, b >> 4), (BLOCK_N, BLOCK_K))
    s = group_values(scale_ptr, rn, k, K, stride_sn, stride_sk, 0, GROUP_K, BLOCK_K, BLOCK_N, N_AXIS)
    if DECODE == DEC_FP4:
        w = e2m1_to_float(q) * e8m0_to_float(s)
    else:
        z = group_values(zero_ptr, rn, k, K, stride_sn, stride_sk, 0, GROUP_K, BLOCK_K, BLOCK_N, N_AXIS)
        w = (q.to(tl.float32) - z.to(tl.float32)) * s.to(tl.float32)
    return w


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
