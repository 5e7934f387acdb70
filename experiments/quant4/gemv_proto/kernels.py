"""Prototype 4-bit GEMVs (M = 1) for the decode-instruction study: weights read as int32 words of
eight nibbles (nibble j of word w = column 8w + j, the packed uint8 layout viewed as int32), each
nibble decoded with a shift and a masked OR into a float32 without any int-to-float conversion:
int4 as 1 + q / 16 (mantissa bits 19..22), e2m1 as its value times 2**-126 (exponent and mantissa
bits 22..24, sign bit 31: the codes 0 / 1 land on 0 and the denormal 2**-127, exact). The group
scale is applied to each group's partial sum: int4  s (sum q a - z sum a) = s (16 sum f a - (16 + z)
sum a); e2m1  2**(e - 127) * 2**26 * sum f (a * 2**100) (the activation pre-scaled so that products
stay normal). K splits add float32 partials atomically."""

import triton
import triton.language as tl


@triton.jit
def dec_int4(words, J: tl.constexpr):
    if J * 4 <= 19:
        x = words << (19 - 4 * J)
    else:
        x = words >> (4 * J - 19)
    return ((x & 0x00780000) | 0x3F800000).to(tl.float32, bitcast=True)


@triton.jit
def dec_fp4(words, J: tl.constexpr):
    if J * 4 <= 22:
        mag = words << (22 - 4 * J)
    else:
        mag = words >> (4 * J - 22)
    sgn = words << (28 - 4 * J)
    return ((mag & 0x01C00000) | (sgn & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def dec(words, J: tl.constexpr, FP4: tl.constexpr):
    if FP4:
        v = dec_fp4(words, J)
    else:
        v = dec_int4(words, J)
    return v


@triton.jit
def w4_gemv_strided(a_ptr, b_ptr, s_ptr, z_ptr, c_ptr, N, K, K_SPLIT, stride_bn, stride_sn,
                    FP4: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
                    PREFETCH: tl.constexpr = False):
    """The activation of nibble j loaded per nibble (8 strided loads a word)."""
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
        for j in tl.static_range(8):
            a_j = tl.load(a_ptr + (kw + offs_w) * 8 + j).to(tl.float32)
            if FP4:
                a_j = a_j * 1.2676506002282294e30  # 2**100
            part += dec(words, j, FP4) * a_j[None, :]
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
        out = out * 67108864.0  # 2**26
    tl.atomic_add(c_ptr + offs_n, out, mask=offs_n < N, sem="relaxed")


@triton.jit
def w4_gemv_split(a_ptr, b_ptr, s_ptr, z_ptr, c_ptr, N, K, K_SPLIT, stride_bn, stride_sn,
                  FP4: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
                    PREFETCH: tl.constexpr = False):
    """The activation loaded as a contiguous [BLOCK_W, 8] tile and split into its 8 nibble columns."""
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
        a8 = tl.load(a_ptr + (kw + offs_w)[:, None] * 8 + tl.arange(0, 8)[None, :]).to(tl.float32)
        if FP4:
            a8 = a8 * 1.2676506002282294e30
        ev, od = tl.split(tl.reshape(a8, (BLOCK_W, 4, 2)))
        e0, e1 = tl.split(tl.reshape(ev, (BLOCK_W, 2, 2)))
        o0, o1 = tl.split(tl.reshape(od, (BLOCK_W, 2, 2)))
        a0, a4 = tl.split(e0)
        a2, a6 = tl.split(e1)
        a1, a5 = tl.split(o0)
        a3, a7 = tl.split(o1)
        part = dec(words, 0, FP4) * a0[None, :]
        part += dec(words, 1, FP4) * a1[None, :]
        part += dec(words, 2, FP4) * a2[None, :]
        part += dec(words, 3, FP4) * a3[None, :]
        part += dec(words, 4, FP4) * a4[None, :]
        part += dec(words, 5, FP4) * a5[None, :]
        part += dec(words, 6, FP4) * a6[None, :]
        part += dec(words, 7, FP4) * a7[None, :]
        part_g = tl.sum(tl.reshape(part, (BLOCK_N, GPI, WPG)), axis=2)
        g = kw // WPG + offs_g
        if FP4:
            e = tl.load(s_ptr + rn[:, None] * stride_sn + g[None, :]).to(tl.int32)
            acc += part_g * (e << 23).to(tl.float32, bitcast=True)
        else:
            asum = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
            asum_g = tl.sum(tl.reshape(asum, (GPI, WPG)), axis=1)
            s = tl.load(s_ptr + rn[:, None] * stride_sn + g[None, :]).to(tl.float32)
            z = tl.load(z_ptr + rn[:, None] * stride_sn + g[None, :]).to(tl.float32)
            acc += s * (16.0 * part_g - (16.0 + z) * asum_g[None, :])
        b_ptrs += BLOCK_W
    out = tl.sum(acc, axis=1)
    if FP4:
        out = out * 67108864.0
    tl.atomic_add(c_ptr + offs_n, out, mask=offs_n < N, sem="relaxed")
