"""Prototype 4-bit GEMVs (M = 1) for the decode-instruction study, around the production decode
(tritonllm/kernels/gemv_w4.py: nibble j of int32 word w is column 8w + j, one shift and one masked
OR a nibble). What the study varied: how the activation reaches the eight nibble columns
(SPLIT_ACT: one contiguous [BLOCK_W, 8] tile split in registers, as production does, or eight
strided loads a word), whether the next weight tile's load is issued before this one is decoded
(PREFETCH), and tiles / K splits (K splits add float32 partials atomically)."""

import triton
import triton.language as tl

from tritonllm.kernels.gemv_w4 import FP4_ACT_SCALE, FP4_OUT_SCALE, _eight_columns, _nibble

VARIANTS = {"w4_gemv_strided": False, "w4_gemv_split": True}  # name in the results -> SPLIT_ACT


@triton.jit
def w4_gemv_proto(a_ptr, b_ptr, s_ptr, z_ptr, c_ptr, N, K, K_SPLIT, stride_bn, stride_sn,
                  FP4: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
                  SPLIT_ACT: tl.constexpr, PREFETCH: tl.constexpr = False):  # fmt: skip
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < N, offs_n, 0)
    offs_w = tl.arange(0, BLOCK_W)
    WPG: tl.constexpr = GROUP // 8
    GPI: tl.constexpr = BLOCK_W // WPG
    offs_g = tl.arange(0, GPI)
    kw0 = pid_k * (K_SPLIT // 8)
    b_ptrs = b_ptr + rn[:, None] * stride_bn + (kw0 + offs_w)[None, :]
    acc = tl.zeros((BLOCK_N, GPI), tl.float32)
    kw_end = kw0 + K_SPLIT // 8
    if PREFETCH:
        nxt = tl.load(b_ptrs)
    for kw in range(kw0, kw_end, BLOCK_W):
        if PREFETCH:  # the next tile's load is in flight while this one is decoded
            words = nxt
            nxt = tl.load(b_ptrs + BLOCK_W, mask=(kw + BLOCK_W + 0 * offs_w < kw_end)[None, :], other=0)
        else:
            words = tl.load(b_ptrs)
        part = tl.zeros((BLOCK_N, BLOCK_W), tl.float32)
        asum = tl.zeros((BLOCK_W,), tl.float32)
        if SPLIT_ACT:
            a8 = tl.load(a_ptr + (kw + offs_w)[:, None] * 8 + tl.arange(0, 8)[None, :]).to(tl.float32)
            if FP4:
                a8 = a8 * FP4_ACT_SCALE
            a0, a1, a2, a3, a4, a5, a6, a7 = _eight_columns(a8)
            part = _nibble(words, 0, FP4, True) * a0[None, :]
            part += _nibble(words, 1, FP4, True) * a1[None, :]
            part += _nibble(words, 2, FP4, True) * a2[None, :]
            part += _nibble(words, 3, FP4, True) * a3[None, :]
            part += _nibble(words, 4, FP4, True) * a4[None, :]
            part += _nibble(words, 5, FP4, True) * a5[None, :]
            part += _nibble(words, 6, FP4, True) * a6[None, :]
            part += _nibble(words, 7, FP4, True) * a7[None, :]
            asum = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
        else:
            for j in tl.static_range(8):
                a_j = tl.load(a_ptr + (kw + offs_w) * 8 + j).to(tl.float32)
                if FP4:
                    a_j = a_j * FP4_ACT_SCALE
                part += _nibble(words, j, FP4, True) * a_j[None, :]
                asum += a_j
        part_g = tl.sum(tl.reshape(part, (BLOCK_N, GPI, WPG)), axis=2)
        g = kw // WPG + offs_g
        if FP4:
            e = tl.load(s_ptr + rn[:, None] * stride_sn + g[None, :]).to(tl.int32)
            acc += part_g * (e << 23).to(tl.float32, bitcast=True)
        else:
            asum_g = tl.sum(tl.reshape(asum, (GPI, WPG)), axis=1)
            s = tl.load(s_ptr + rn[:, None] * stride_sn + g[None, :]).to(tl.float32)
            z = tl.load(z_ptr + rn[:, None] * stride_sn + g[None, :]).to(tl.float32)
            acc += s * (16.0 * part_g - (16.0 + z) * asum_g[None, :])
        b_ptrs += BLOCK_W
    out = tl.sum(acc, axis=1)
    if FP4:
        out = out * FP4_OUT_SCALE
    tl.atomic_add(c_ptr + offs_n, out, mask=offs_n < N, sem="relaxed")
