"""Scale and weight-decoding helpers shared by the GEMM family's kernels (gemm.py, gemm_gemv.py)."""

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


@triton.jit
def int4_dequant(q, scale_ptr, zero_ptr, rn, group, stride_sn, stride_sk, N_AXIS: tl.constexpr):
    """int4 values q (0..15, columns rn along axis N_AXIS of q) -> float32 (q - zero) * scale of K
    group `group`; scales and zero points float32 [N, K / G] with the same strides."""
    s = tl.load(scale_ptr + rn * stride_sn + group * stride_sk)
    z = tl.load(zero_ptr + rn * stride_sn + group * stride_sk)
    if N_AXIS == 0:
        w = (q.to(tl.float32) - z[:, None]) * s[:, None]
    else:
        w = (q.to(tl.float32) - z[None, :]) * s[None, :]
    return w
