"""The 4-bit GEMV (int4 with group scales and zero points; MXFP4), for decode-sized M.

At M = 1 a 4-bit weight's read is a quarter of bf16's, and decoding it is the cost: the first GEMV
(kernels/gemm_gemv.py, byte tiles, nibbles widened one by one, activations loaded per nibble half)
ran 11 or more instructions a weight and moved 0.7-1.3 TB/s of the H200's 4.8. Here the packed
uint8 [N, K / 2] weight is read as int32 words of eight nibbles (nibble j of word w is column 8w + j:
the same bytes, viewed), and each nibble becomes a float32 with one shift and one masked OR (a
single LOP3), no int-to-float conversion:

- int4 code q -> the float 1 + q / 16 (q in mantissa bits 19..22 under the exponent of 1.0); per
  group, sum_k (q_k - z) s a_k = s (16 sum_k f_k a_k - (16 + z) sum_k a_k), so the scale, the zero
  point and the bias of the code are applied once per group and row;
- e2m1 code (sign, two exponent bits, one mantissa bit) -> its value times 2**-126: the magnitude
  bits go to float bits 22..24, the sign to bit 31; codes 0 and 1 land on 0 and the denormal
  2**-127, exactly (FMA keeps denormals on NVIDIA GPUs and in the interpreter; ROCm takes the exact
  where-based decode, FP4_BITS off). The activation is pre-scaled by 2**100 so that every product
  is a normal float, and the e8m0 group scale and 2**26 finish the sum.

The activation's [BLOCK_W, 8] tile is loaded contiguously and split into its eight nibble columns.
Programs of one weight tile and different rows are adjacent (the weight comes from HBM once, from
L2 for the other rows); K splits write float32 partials that gemm.py's reduce kernel sums. The MoE
GEMV (kernels/moe_gemv.py) calls `w4_row_dot` for its MXFP4 experts.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from tritonllm import platform
from tritonllm.kernels.gemm_scales import e2m1_to_float, epilogue
from tritonllm.kernels.launch import pdl_wait

# How the word GEMVs decode and multiply 4-bit codes: the kernels' FP4_BITS constexpr, read from here at each
# launch (gemm.py, moe.py). 0: MXFP4's exact where-based decode (ROCm); 1: MXFP4's 2**-126 float32 bits (needs
# denormal float32 FMAs: NVIDIA GPUs, the interpreter's numpy), int4's 1 + q / 16 floats; 2: MXFP4 and int4 nibble
# pairs decoded into fp16x2 and multiplied by packed half-precision FMAs (_groups_half2; PTX fma.rn.f16x2: NVIDIA
# GPUs' default since session 36, where the H200 measured Llama-3-8B batch 1 int4 +14% (+10% at the float32
# decode's tiling), MXFP4 +12.5%, gpt-oss-20b +4.7%), 3: the same with the packed instructions emulated in Triton
# operations (the interpreter's build of 2, tested by tests/kernels/test_w4_half2.py; the interpreter's default
# stays 1, the exact float32 reference).
# TRITONLLM_W4_HALF2=0 / 1 overrides the default
FP4_EXACT, FP4_F32, FP4_HALF2, FP4_HALF2_EMULATED = 0, 1, 2, 3


def fp4_mode() -> int:
    """The 4-bit decode this platform and TRITONLLM_W4_HALF2 select (see FP4_EXACT ...): half pairs on NVIDIA
    GPUs unless TRITONLLM_W4_HALF2=0, float32 in the interpreter unless TRITONLLM_W4_HALF2=1."""
    text = os.environ.get("TRITONLLM_W4_HALF2", "0" if platform.is_interpreter() else "1")
    if text not in ("0", "1"):
        raise ValueError(f"TRITONLLM_W4_HALF2={text!r}: 0 (float32 decode) or 1 (packed half precision)")
    if platform.PLATFORM == "rocm":
        return FP4_EXACT
    if text == "1":
        return FP4_HALF2_EMULATED if platform.is_interpreter() else FP4_HALF2
    return FP4_F32


FP4_BITS = fp4_mode()
_HALF2 = tl.constexpr(FP4_HALF2)  # for the kernels (a global they read must be a constexpr)
FP4_ACT_SCALE = tl.constexpr(2.0**100)  # activations x this, so that products with 2**-126-scaled values stay normal
FP4_OUT_SCALE = tl.constexpr(2.0**26)  # = 2**126 / 2**100
# a nibble pair's e2m1 magnitudes at bits 6..8 / 22..24 and signs at 15 / 31 (0x80008000 as an int32): _pair_fp4,
# and the Hopper kernels' decodes into bf16x2 (gemv_w4_sm90, gemm_w4_sm90), which pass them as kernel arguments
FP4_PAIR_MASKS = (0x01C001C0, -(2**31) | 0x8000)


@triton.jit
def _nibble_int4(words, J: tl.constexpr):
    """Nibble J of each int32 word (an int4 code q) -> the float32 1 + q / 16."""
    if J * 4 <= 19:
        x = words << (19 - 4 * J)
    else:
        x = words >> (4 * J - 19)
    return ((x & 0x00780000) | 0x3F800000).to(tl.float32, bitcast=True)


@triton.jit
def _nibble_fp4(words, J: tl.constexpr, FP4_BITS: tl.constexpr):
    """Nibble J of each int32 word (an e2m1 code) -> its value x 2**-126 (FP4_BITS), or its value."""
    if FP4_BITS:
        if J * 4 <= 22:
            mag = words << (22 - 4 * J)
        else:
            mag = words >> (4 * J - 22)
        sign = words << (28 - 4 * J)
        v = ((mag & 0x01C00000) | (sign & -2147483648)).to(tl.float32, bitcast=True)
    else:
        v = e2m1_to_float((words >> (4 * J)) & 0xF)
    return v


@triton.jit
def _pair_fp4(words, J: tl.constexpr, MAG=FP4_PAIR_MASKS[0], SIGN=FP4_PAIR_MASKS[1]):
    """Nibbles J and J + 4 (J < 4) of each int32 word (e2m1 codes) -> their values x 2**-126 as two float32.
    Two shifts and two LOP3 place both nibbles as a bf16x2 would hold them (J's magnitude at bits 6..8 and sign
    at 15, J + 4's at 22..24 and 31: under each half's exponent); the high half alone (one LOP3) is J + 4's
    float32 and the low half shifted up (one shift) J's: three instructions a nibble where _nibble_fp4 takes
    four. MAG / SIGN: FP4_PAIR_MASKS (the Gluon GEMV passes them as kernel arguments, kept in registers)."""
    if J * 4 <= 6:
        mag = words << (6 - 4 * J)
    else:
        mag = words >> (4 * J - 6)
    pair = (mag & MAG) | ((words << (12 - 4 * J)) & SIGN)
    lo = (pair << 16).to(tl.float32, bitcast=True)
    hi = (pair & -65536).to(tl.float32, bitcast=True)
    return lo, hi


# fp16 pairs (FP4_HALF2): each byte of a word's two halves (its odd nibbles, its even ones) one e2m1 code as an fp16's
# high byte, the magnitude at bits 1..3 and the sign at 7 (its value x 2**-14): masks of the magnitudes and signs
HALF2_MASKS = (0x0E0E0E0E, -(2**31) | 0x00808080)
HALF2_HIGH_BYTES = tl.constexpr(-(2**24) | 0x0000FF00)  # 0xFF00FF00: bytes 1 and 3, each fp16's high byte
HALF2_EXP_BIAS = tl.constexpr(141)  # a row's activations x 2**(141 - e), e its largest |a|'s float32 exponent field
# int4: nibbles j and j + 4 as fp16x2 subnormals, q 2**-24 (the low nibble of a byte) or q 2**-20 (the high one)
INT4_HALF2_MASKS = (0x000F000F, 0x00F000F0)
INT4_ODD_SCALE = tl.constexpr(1.0 / 16.0)  # the odd activation columns' factor: their nibbles decode 16 x larger
INT4_HALF2_SCALE = tl.constexpr(2.0**-24)
HALF2_MIN_EXP = tl.constexpr(14)  # e at least this: both factors normal floats (an all-zero row: 14)


@triton.jit
def _low_bytes_up(x, ASM: tl.constexpr):
    """Bytes 0 and 2 of each int32 moved to bytes 1 and 3, zeros below: PTX prmt (ASM: one byte permute), else a
    shift and a mask."""
    if ASM:
        out = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0, 0x2404;", "=r,r", [x], dtype=tl.int32, is_pure=True,
                                        pack=1)  # fmt: skip
    else:
        out = (x << 8) & HALF2_HIGH_BYTES
    return out


@triton.jit
def _fp16_pairs(words, MAG=HALF2_MASKS[0], SIGN=HALF2_MASKS[1], ASM: tl.constexpr = False):
    """Each int32 word's eight e2m1 codes as four int32s holding fp16x2 pairs: nibbles (j, j + 4) for j = 0..3, j
    low, each its value x 2**-14 (the magnitude bits under fp16's exponent: code 1, 0.5, a subnormal; the sign at
    the half's top). The word's odd nibbles, then its even ones, are first moved each into a byte as an fp16's high
    byte (three and four instructions); then bytes 1 and 3 of each are a pair in place (one mask), bytes 0 and 2
    one byte lower (a shift and a mask, or one byte permute): 11 to 13 instructions a word, against 15 for pairs
    decoded one at a time."""
    odd = ((words >> 3) & MAG) | (words & SIGN)  # byte b: nibble 2 b + 1
    even = ((words << 1) & MAG) | ((words << 4) & SIGN)  # byte b: nibble 2 b
    return _low_bytes_up(even, ASM), _low_bytes_up(odd, ASM), even & HALF2_HIGH_BYTES, odd & HALF2_HIGH_BYTES


@triton.jit
def _half(x, HIGH: tl.constexpr):
    """The low or high fp16 of each int32 (an fp16x2), as float32."""
    if HIGH:
        h = (x >> 16).to(tl.int16)
    else:
        h = (x & 0xFFFF).to(tl.int16)
    return h.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _as_half2(lo, hi):
    """Two float32 -> one int32 holding them as fp16x2 (lo low), each rounded to nearest."""
    lo16 = lo.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi16 = hi.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
    return lo16 | (hi16 << 16)


@triton.jit
def _pack_half2(lo, hi, ASM: tl.constexpr):
    """Two float32 -> one int32 holding them as fp16x2 (lo low): PTX cvt.rn.f16x2.f32 (ASM), else emulated."""
    if ASM:
        out = tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $1, $2;", "=r,f,f", [hi, lo], dtype=tl.int32,
                                        is_pure=True, pack=1)  # fmt: skip
    else:
        out = _as_half2(lo, hi)
    return out


@triton.jit
def _hfma2(a, b, c, ASM: tl.constexpr):
    """a * b + c on int32s holding fp16x2 pairs: PTX fma.rn.f16x2 (ASM, one rounding), else emulated (the product
    exact in float32, the sum rounded to float32, then to fp16)."""
    if ASM:
        out = tl.inline_asm_elementwise("fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                        is_pure=True, pack=1)  # fmt: skip
    else:
        out = _as_half2(_half(a, False) * _half(b, False) + _half(c, False),
                        _half(a, True) * _half(b, True) + _half(c, True))  # fmt: skip
    return out


@triton.jit
def _pair_int4_half2(words, J: tl.constexpr, LOW=INT4_HALF2_MASKS[0], HIGH=INT4_HALF2_MASKS[1]):
    """Nibbles J and J + 4 (J < 4) of each int32 word (int4 codes q) as an fp16x2 of subnormals, exactly: q 2**-24
    for the even J (a byte's low nibble), q 2**-20 for the odd (the high one: their activations are scaled by
    INT4_ODD_SCALE). One LOP3 a pair, and one shift a word (J = 2, 3: the word shifted by 8, shared)."""
    if J == 0:
        q = words & LOW
    elif J == 1:
        q = words & HIGH
    elif J == 2:
        q = (words >> 8) & LOW
    else:
        q = (words >> 8) & HIGH
    return q


@triton.jit
def _pairs_dot_half2(words, p0, p1, p2, p3, acc, FP4: tl.constexpr, ASM: tl.constexpr, m0=None, m1=None):
    """acc + the products of each word's four nibble pairs (MXFP4: _fp16_pairs; int4: _pair_int4_half2) with the
    activation pairs p0..p3, chained by packed FMAs (int32s holding fp16x2). m0, m1: the decode's masks (HALF2_MASKS
    or INT4_HALF2_MASKS) as values, which the Gluon GEMV passes in registers; None: the literals."""
    if FP4:
        if m0 is None:
            w0, w1, w2, w3 = _fp16_pairs(words, ASM=ASM)
        else:
            w0, w1, w2, w3 = _fp16_pairs(words, m0, m1, ASM)
        acc = _hfma2(w0, p0, acc, ASM)
        acc = _hfma2(w1, p1, acc, ASM)
        acc = _hfma2(w2, p2, acc, ASM)
        acc = _hfma2(w3, p3, acc, ASM)
    elif m0 is None:
        acc = _hfma2(_pair_int4_half2(words, 0), p0, acc, ASM)
        acc = _hfma2(_pair_int4_half2(words, 1), p1, acc, ASM)
        acc = _hfma2(_pair_int4_half2(words, 2), p2, acc, ASM)
        acc = _hfma2(_pair_int4_half2(words, 3), p3, acc, ASM)
    else:
        acc = _hfma2(_pair_int4_half2(words, 0, m0, m1), p0, acc, ASM)
        acc = _hfma2(_pair_int4_half2(words, 1, m0, m1), p1, acc, ASM)
        acc = _hfma2(_pair_int4_half2(words, 2, m0, m1), p2, acc, ASM)
        acc = _hfma2(_pair_int4_half2(words, 3, m0, m1), p3, acc, ASM)
    return acc


@triton.jit
def _halves(x):
    """[..., 2W] -> its even and odd [..., W] (in-register splits)."""
    return tl.split(tl.reshape(x, x.shape[:-1] + [x.shape[-1] // 2, 2]))


@triton.jit
def _quarters(x):
    """[..., 4W] -> its four [..., W] slices by index modulo 4 (in-register splits: index 4g + 2i + j, j then i)."""
    e, o = _halves(x)
    x0, x2 = _halves(e)
    x1, x3 = _halves(o)
    return x0, x1, x2, x3


@triton.jit
def _chunk_dot_half2(words, a0, a1, a2, a3, a4, a5, a6, a7, CW: tl.constexpr, FP4: tl.constexpr,
                     ASM: tl.constexpr):  # fmt: skip
    """Per chunk of CW (1, 2 or 4) consecutive words of words [..., BLOCK_W]: sum_k w_k a_k as float32 [...,
    BLOCK_W / CW], from products taken in fp16 pairs: a_j [..., BLOCK_W] the activations' columns (a_j[w] =
    a[8 w + j]), already scaled into fp16's range, packed as the pairs (j, j + 4) the decode gives; a chunk's
    4 CW packed FMAs a row chained in fp16, then its two halves summed in float32. w_k: MXFP4's e2m1 value x
    2**-14 (_fp16_pairs), int4's code q x 2**-24 (_pair_int4_half2)."""
    tl.static_assert(CW == 1 or CW == 2 or CW == 4, "FP4_HALF2: chunks of 1, 2 or 4 words")
    p0 = _pack_half2(a0, a4, ASM)
    p1 = _pack_half2(a1, a5, ASM)
    p2 = _pack_half2(a2, a6, ASM)
    p3 = _pack_half2(a3, a7, ASM)
    if CW == 1:
        acc = _pairs_dot_half2(words, p0, p1, p2, p3, tl.zeros_like(words), FP4, ASM)
    elif CW == 2:
        w0, w1 = _halves(words)
        q00, q01 = _halves(p0)
        q10, q11 = _halves(p1)
        q20, q21 = _halves(p2)
        q30, q31 = _halves(p3)
        acc = _pairs_dot_half2(w0, q00, q10, q20, q30, tl.zeros_like(w0), FP4, ASM)
        acc = _pairs_dot_half2(w1, q01, q11, q21, q31, acc, FP4, ASM)
    else:  # q_jw: pair j of the chunk's word w
        w0, w1, w2, w3 = _quarters(words)
        q00, q01, q02, q03 = _quarters(p0)
        q10, q11, q12, q13 = _quarters(p1)
        q20, q21, q22, q23 = _quarters(p2)
        q30, q31, q32, q33 = _quarters(p3)
        acc = _pairs_dot_half2(w0, q00, q10, q20, q30, tl.zeros_like(w0), FP4, ASM)
        acc = _pairs_dot_half2(w1, q01, q11, q21, q31, acc, FP4, ASM)
        acc = _pairs_dot_half2(w2, q02, q12, q22, q32, acc, FP4, ASM)
        acc = _pairs_dot_half2(w3, q03, q13, q23, q33, acc, FP4, ASM)
    return _half(acc, False) + _half(acc, True)


@triton.jit
def _groups_half2(words, a8, a_scale, s, z, GPI: tl.constexpr, BLOCK_W: tl.constexpr, FP4: tl.constexpr,
                  ASM: tl.constexpr):  # fmt: skip
    """One K tile's per-group sums in half pairs ([..., GPI], scaled as _tile_groups's, times the row's factor
    out of a_scale, half2_scales): MXFP4, each group (up to 4 words) one chain, times its e8m0 scale s; int4, the
    groups in chunks of up to 4 words of sum q a, then s (their sum - z x the group's activation sum) in float32
    (z: the zero points, any float; the difference loses about 2**-11 of sum q a, a few times the result's size
    when the activations share a sign)."""
    WPC: tl.constexpr = BLOCK_W // GPI  # words a group of the tile
    if FP4:
        a0, a1, a2, a3, a4, a5, a6, a7 = _eight_columns(a8.to(tl.float32) * a_scale)
        tl.static_assert(WPC <= 4, "FP4_HALF2: an MXFP4 group is 4 words")
        part = _chunk_dot_half2(words, a0, a1, a2, a3, a4, a5, a6, a7, WPC, True, ASM)
        out = part * (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    else:  # the odd columns' nibbles decode 16 x larger (_pair_int4_half2)
        j = tl.arange(0, 8)
        a0, a1, a2, a3, a4, a5, a6, a7 = _eight_columns(
            a8.to(tl.float32) * (a_scale * tl.where(j % 2 == 1, INT4_ODD_SCALE, 1.0))
        )
        CW: tl.constexpr = min(WPC, 4)
        CPG: tl.constexpr = WPC // CW  # chunks a group
        part = _chunk_dot_half2(words, a0, a1, a2, a3, a4, a5, a6, a7, CW, False, ASM)
        if CPG > 1:
            part = tl.sum(tl.reshape(part, part.shape[:-1] + [GPI, CPG]), axis=len(part.shape))
        a_sum = ((a0 + a2) + (a4 + a6)) + 16.0 * ((a1 + a3) + (a5 + a7))
        a_sum_g = tl.sum(tl.reshape(a_sum, a_sum.shape[:-1] + [GPI, WPC]), axis=len(a_sum.shape))
        # the chunks' sums and the zero points' term (the scaled activations' sum) are both q a' 2**-24's scale
        out = s.to(tl.float32) * (part - z.to(tl.float32) * a_sum_g * INT4_HALF2_SCALE)
    return out


# half2_row_exp's chunks of 1,024 activations in flight at once for one row (and the Gluon GEMV's _row_exp): a row
# of up to 4,096 in one L2 round trip, where session 35's took one chunk at a time (gpt-oss's w13, K = 2,880: three
# trips one after another; Llama-3-8B's down, 14,336: fourteen). The same registers (sm90 SASS, Triton 3.6: the MoE
# w13 95, the dense GEMVs 92 / 96, the Gluon GEMV 128 / 160), fewer instructions. TRITONLLM_W4_ROW_EXP_LOADS: A/B
ROW_EXP_LOADS = tl.constexpr(int(os.environ.get("TRITONLLM_W4_ROW_EXP_LOADS", "4")))


@triton.jit
def half2_row_exp(a_ptr, rows, k_start, k_end, stride_am, stride_ak, ROWS: tl.constexpr):
    """FP4_HALF2: the float32 exponent field e of each activation row's largest |a| over [k_start, k_end) (at
    least HALF2_MIN_EXP): a scalar for ROWS 1 (rows a scalar), [ROWS] for `rows` [ROWS]. The K loop scales the
    row by 2**(HALF2_EXP_BIAS - e) (largest below 2**15: fp16's range holds it and every product) and the sum by
    2**(e - 127) (half2_scales)."""
    CHUNK: tl.constexpr = 1024
    offs = tl.arange(0, CHUNK)
    if ROWS == 1:  # ROW_EXP_LOADS chunks in flight an iteration
        m = tl.zeros((CHUNK,), tl.float32)
        for k in range(k_start, k_end, ROW_EXP_LOADS * CHUNK):
            for i in tl.static_range(ROW_EXP_LOADS):
                a = tl.load(a_ptr + rows * stride_am + (k + i * CHUNK + offs) * stride_ak,
                            mask=k + i * CHUNK + offs < k_end, other=0.0)  # fmt: skip
                m = tl.maximum(m, tl.abs(a.to(tl.float32)))
        amax = tl.max(m, axis=0)
    else:
        m = tl.zeros((ROWS, CHUNK), tl.float32)
        for k in range(k_start, k_end, CHUNK):
            a = tl.load(a_ptr + rows[:, None] * stride_am + (k + offs)[None, :] * stride_ak,
                        mask=(k + offs < k_end)[None, :], other=0.0)  # fmt: skip
            m = tl.maximum(m, tl.abs(a.to(tl.float32)))
        amax = tl.max(m, axis=1)
    return tl.maximum(amax.to(tl.int32, bitcast=True) >> 23, HALF2_MIN_EXP)


@triton.jit
def half2_scales(e):
    """The activation factor 2**(HALF2_EXP_BIAS - e) and the output factor 2**(e - 127) of half2_row_exp's e
    (the decode's 2**-14 included: 141 - 127 = 14), as float32."""
    a_exp = -e + (HALF2_EXP_BIAS + 127)  # tensor first: a constexpr minus a tensor is a constexpr in the interpreter
    return (a_exp << 23).to(tl.float32, bitcast=True), (e << 23).to(tl.float32, bitcast=True)


def half2_bound_exp(bound: float) -> int:
    """A_EXP for activation rows known to hold |a| <= bound (w4_row_dot): the float32 exponent field of `bound`
    (at least HALF2_MIN_EXP); 0 (take the pass over the rows) for a bound that is not finite and positive, or
    past 2**10, where a fixed factor would leave ordinary activations too small for fp16's precision."""
    if not (0.0 < bound <= 2.0**10):
        return 0
    return max(math.frexp(bound)[1] + 126, HALF2_MIN_EXP.value)


@triton.jit
def _nibble(words, J: tl.constexpr, FP4: tl.constexpr, FP4_BITS: tl.constexpr):
    if FP4:
        v = _nibble_fp4(words, J, FP4_BITS)
    else:
        v = _nibble_int4(words, J)
    return v


@triton.jit
def _act_scaled(a):
    """The activations as float32 times FP4_ACT_SCALE (2**100). bf16: widened (exact), then 100 added to the
    exponent bits, which ptxas folds into the widening (one IMAD or LEA an element, where a multiply took
    another); a zero becomes 2**-27 (2**-127 of a unit activation, below any product that counts)."""
    if a.dtype == tl.bfloat16:
        a = (a.to(tl.float32).to(tl.int32, bitcast=True) + (100 << 23)).to(tl.float32, bitcast=True)
    else:
        a = a.to(tl.float32) * FP4_ACT_SCALE
    return a


@triton.jit
def _eight_columns(a8):
    """[..., 8] -> the eight [...] columns, in-register splits."""
    even, odd = tl.split(tl.reshape(a8, a8.shape[:-1] + [4, 2]))
    e0, e1 = tl.split(tl.reshape(even, even.shape[:-1] + [2, 2]))
    o0, o1 = tl.split(tl.reshape(odd, odd.shape[:-1] + [2, 2]))
    a0, a4 = tl.split(e0)
    a2, a6 = tl.split(e1)
    a1, a5 = tl.split(o0)
    a3, a7 = tl.split(o1)
    return a0, a1, a2, a3, a4, a5, a6, a7


@triton.jit
def _word_dot(words, a0, a1, a2, a3, a4, a5, a6, a7):
    """sum_j w_j a_j over the eight e2m1 nibbles j of each word (values x 2**-126, _pair_fp4), each pair
    multiplied as it is decoded."""
    w0, w4 = _pair_fp4(words, 0)
    acc = w0 * a0
    acc += w4 * a4
    w1, w5 = _pair_fp4(words, 1)
    acc += w1 * a1
    acc += w5 * a5
    w2, w6 = _pair_fp4(words, 2)
    acc += w2 * a2
    acc += w6 * a6
    w3, w7 = _pair_fp4(words, 3)
    acc += w3 * a3
    acc += w7 * a7
    return acc


@triton.jit
def _group_sums(part, GPI: tl.constexpr, BLOCK_W: tl.constexpr):
    """[..., BLOCK_W] per-word sums -> [..., GPI] per-group sums."""
    return tl.sum(tl.reshape(part, part.shape[:-1] + [GPI, BLOCK_W // GPI]), axis=len(part.shape))


@triton.jit
def _tile_groups(words, a8, s_ptrs, z_ptrs, g_in, FP4: tl.constexpr, FP4_BITS: tl.constexpr, GPI: tl.constexpr,
                 BLOCK_W: tl.constexpr, LOADED: tl.constexpr = False, a_scale=1.0):  # fmt: skip
    """One K tile's contribution to the per-group accumulator: words [BLOCK_N, BLOCK_W] (or [1, ...]
    for several rows), a8 the activation tile broadcastable against them ([1, BLOCK_W, 8] for one
    row, [ROWS, 1, BLOCK_W, 8] for several: a_j[w] = a[8 (kw + w) + j]), s_ptrs / z_ptrs / g_in the
    tile's groups' scales, zero points and mask ([BLOCK_N, GPI]; LOADED: s_ptrs / z_ptrs are the
    loaded scales and zero points themselves). Returns [BLOCK_N, GPI] (or [ROWS, BLOCK_N, GPI]): each
    group's s (16 sum f a - (16 + z) sum a), or e8m0-scaled sum f a. FP4_HALF2: a_scale, the activation rows'
    factors (half2_scales), broadcastable against a8."""
    if FP4_BITS >= _HALF2:
        s = s_ptrs if LOADED else tl.load(s_ptrs, mask=g_in, other=0)
        z = 0 if FP4 else (z_ptrs if LOADED else tl.load(z_ptrs, mask=g_in, other=0))
        out = _groups_half2(words, a8, a_scale, s, z, GPI, BLOCK_W, FP4, FP4_BITS == _HALF2)
    elif FP4 and FP4_BITS:
        a0, a1, a2, a3, a4, a5, a6, a7 = _eight_columns(_act_scaled(a8))
        part_g = _group_sums(_word_dot(words, a0, a1, a2, a3, a4, a5, a6, a7), GPI, BLOCK_W)
        # the scales loaded where the products need them (LOADS 0's order), e8m0: the float with exponent bits s
        s = s_ptrs if LOADED else tl.load(s_ptrs, mask=g_in, other=0)
        out = part_g * (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    else:
        a0, a1, a2, a3, a4, a5, a6, a7 = _eight_columns(a8.to(tl.float32))
        part = _nibble(words, 0, FP4, FP4_BITS) * a0
        part += _nibble(words, 1, FP4, FP4_BITS) * a1
        part += _nibble(words, 2, FP4, FP4_BITS) * a2
        part += _nibble(words, 3, FP4, FP4_BITS) * a3
        part += _nibble(words, 4, FP4, FP4_BITS) * a4
        part += _nibble(words, 5, FP4, FP4_BITS) * a5
        part += _nibble(words, 6, FP4, FP4_BITS) * a6
        part += _nibble(words, 7, FP4, FP4_BITS) * a7
        part_g = _group_sums(part, GPI, BLOCK_W)
        if FP4:
            s = s_ptrs if LOADED else tl.load(s_ptrs, mask=g_in, other=0)
            out = part_g * (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)
        else:
            a_sum = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
            a_sum_g = tl.sum(tl.reshape(a_sum, a_sum.shape[:-1] + [GPI, BLOCK_W // GPI]), axis=len(a_sum.shape))
            s = s_ptrs if LOADED else tl.load(s_ptrs, mask=g_in, other=0)
            z = (z_ptrs if LOADED else tl.load(z_ptrs, mask=g_in, other=0)).to(tl.float32)
            out = s.to(tl.float32) * (16.0 * part_g - (16.0 + z) * a_sum_g)
    return out


@triton.jit
def w4_row_dot(a_ptr, rows, rows_in, w_ptr, s_ptr, z_ptr, rn, k_start, k_end, stride_am, stride_ak, stride_wn,
               stride_sn, stride_sk, FP4: tl.constexpr, FP4_BITS: tl.constexpr, GROUP_K: tl.constexpr,
               EVEN: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
               LOADS: tl.constexpr = 0, FIRST: tl.constexpr = False, words0=0, s0=0, A_EXP: tl.constexpr = 0):  # fmt: skip
    """sum over k in [k_start, k_end) of w[rn, k] * a[row, k] in float32 for the activation rows
    `rows` ([ROWS] int64, those not `rows_in` read as zeros; rows_in None: all) and the weight rows
    rn: [BLOCK_N] for ROWS 1, [ROWS, BLOCK_N] above (each weight tile decoded once for all rows); rn
    [ROWS, BLOCK_N] pairs activation row r with weight rows rn[r] only (the MoE GEMV's slots, each
    its own expert's rows). w_ptr is the int32 view of the packed weight (stride_wn words a row);
    k_start a multiple of 8 * BLOCK_W and of the group, k_end a multiple of 8 (EVEN: of 8 * BLOCK_W).
    LOADS, when a step's loads are issued: 0 words and activation at the top of the step, the scales
    (and zero points) where the decoded tile needs them, after the activation's layout change (its
    barriers: in the sm90 build the scales' load then waits out a second memory latency a step); 1
    all of the step's loads at its top; 2 those of the next step too, a step ahead in registers
    (more bytes in flight a program, for grids too small to cover HBM's latency). 1 and 2: MXFP4 with
    k_start 0 and rows_in None (the MoE GEMV's calls); there FIRST: step 0's words and scales are words0
    / s0, loaded by the caller (w4_step_weights: the MoE GEMV's w2, before its PDL wait). A_EXP (FP4_HALF2):
    a bound on every row's |a| as a float32 exponent field (half2_bound_exp), which replaces the pass over the
    rows for their largest; 0: the pass."""
    tl.static_assert(LOADS != 0 or not FIRST, "w4_row_dot FIRST: LOADS 1 / 2 only")
    if LOADS != 0:  # the MoE GEMV's MXFP4 only: k_start 0, every activation row read
        tl.static_assert(FP4, "w4_row_dot LOADS 1 / 2: MXFP4 only")
        return _w4_row_dot_ahead(a_ptr, rows, w_ptr, s_ptr, rn, k_end, stride_am, stride_ak, stride_wn, stride_sn,
                                 stride_sk, FP4_BITS, GROUP_K, EVEN, ROWS, BLOCK_N, BLOCK_W, LOADS == 2, FIRST, words0,
                                 s0, A_EXP)  # fmt: skip
    offs_w = tl.arange(0, BLOCK_W)
    WPG: tl.constexpr = GROUP_K // 8  # words a scale group
    GPI: tl.constexpr = BLOCK_W // WPG if BLOCK_W > WPG else 1  # groups a tile (a tile within one group: 1)
    offs_g = tl.arange(0, GPI)
    offs_j = tl.arange(0, 8)
    kw_end = k_end // 8
    rn_w = tl.expand_dims(rn, len(rn.shape))  # [..., BLOCK_N, 1]
    w_ptrs = w_ptr + rn_w * stride_wn + (k_start // 8 + offs_w)
    cols = ((k_start // 8 + offs_w)[:, None] * 8 + offs_j[None, :]) * stride_ak  # [BLOCK_W, 8]
    if ROWS == 1:
        a_ptrs = a_ptr + rows * stride_am + cols
        acc = tl.zeros((BLOCK_N, GPI), tl.float32)
    else:
        a_ptrs = a_ptr + rows[:, None, None] * stride_am + cols[None, :, :]
        acc = tl.zeros((ROWS, BLOCK_N, GPI), tl.float32)
    a_scale, out_scale = _row_scales(a_ptr, rows, k_start, k_end, stride_am, stride_ak, FP4, FP4_BITS, ROWS, A_EXP)
    for kw in range(k_start // 8, kw_end, BLOCK_W):
        in_k = kw + offs_w < kw_end
        if EVEN:
            words = tl.load(w_ptrs)
        else:
            words = tl.load(w_ptrs, mask=in_k, other=0)
        g = kw // WPG + offs_g
        s_ptrs = s_ptr + rn_w * stride_sn + g * stride_sk
        z_ptrs = z_ptr + rn_w * stride_sn + g * stride_sk
        g_in = g * WPG < kw_end
        if ROWS == 1:
            if EVEN:
                a8 = tl.load(a_ptrs)
            else:
                a8 = tl.load(a_ptrs, mask=in_k[:, None], other=0.0)
            acc += _tile_groups(words, a8[None, :, :], s_ptrs, z_ptrs, g_in, FP4, FP4_BITS, GPI, BLOCK_W, False,
                                a_scale)  # fmt: skip
        else:
            if rows_in is None:
                a8 = tl.load(a_ptrs, mask=in_k[None, :, None], other=0.0)
            else:
                a8 = tl.load(a_ptrs, mask=rows_in[:, None, None] & in_k[None, :, None], other=0.0)
            if len(rn.shape) == 1:  # every row against the same weight rows
                acc += _tile_groups(words[None, :, :], a8[:, None, :, :], s_ptrs, z_ptrs, g_in, FP4, FP4_BITS, GPI,
                                    BLOCK_W, False, a_scale)  # fmt: skip
            else:
                acc += _tile_groups(words, a8[:, None, :, :], s_ptrs, z_ptrs, g_in, FP4, FP4_BITS, GPI, BLOCK_W,
                                    False, a_scale)  # fmt: skip
        w_ptrs += BLOCK_W
        a_ptrs += 8 * BLOCK_W * stride_ak
    return tl.sum(acc, axis=len(acc.shape) - 1) * out_scale


@triton.jit
def _row_scales(a_ptr, rows, k_start, k_end, stride_am, stride_ak, FP4: tl.constexpr, FP4_BITS: tl.constexpr,
                ROWS: tl.constexpr, A_EXP: tl.constexpr = 0):  # fmt: skip
    """The factors w4_row_dot's K loop applies to the activation rows (a8 in _tile_groups: [ROWS, 1, 1, 1]
    for several rows) and to the sums ([ROWS, 1]): FP4_HALF2's per row (half2_row_exp, or from the bound A_EXP
    when given), the float32 decode's 2**100 / 2**26 (_act_scaled applies its own), else 1."""
    if FP4_BITS >= _HALF2:
        if A_EXP:  # every row's |a| below 2**(A_EXP - 126): no pass over the rows
            e = (rows * 0).to(tl.int32) + A_EXP
        else:
            e = half2_row_exp(a_ptr, rows, k_start, k_end, stride_am, stride_ak, ROWS)
        a_scale, out_scale = half2_scales(e)
        if not FP4:  # int4's products are q 2**-24 a' (the zero points' term alike), MXFP4's w 2**-14 a'
            out_scale = out_scale * 1024.0
        if ROWS != 1:
            a_scale = a_scale[:, None, None, None]
            out_scale = out_scale[:, None]
    elif FP4 and FP4_BITS:
        a_scale, out_scale = 1.0, FP4_OUT_SCALE
    else:
        a_scale, out_scale = 1.0, 1.0
    return a_scale, out_scale


@triton.jit
def w4_step_weights(w_ptr, s_ptr, rn_w, kw, kw_end, stride_wn, stride_sn, stride_sk, GROUP_K: tl.constexpr,
                    EVEN: tl.constexpr, BLOCK_W: tl.constexpr):  # fmt: skip
    """Step kw's weight loads (MXFP4): the words [..., BLOCK_N, BLOCK_W] of the rows rn_w ([..., BLOCK_N,
    1]) and their e8m0 scales; masked off past kw_end unless EVEN. No operand another kernel writes: the
    MoE GEMV's w2 issues step 0's before its PDL wait (w4_row_dot's FIRST)."""
    WPG: tl.constexpr = GROUP_K // 8
    GPI: tl.constexpr = BLOCK_W // WPG if BLOCK_W > WPG else 1
    offs_w = kw + tl.arange(0, BLOCK_W)
    w_ptrs = w_ptr + rn_w * stride_wn + offs_w
    g = kw // WPG + tl.arange(0, GPI)
    if EVEN:
        words = tl.load(w_ptrs)
    else:
        words = tl.load(w_ptrs, mask=offs_w < kw_end, other=0)
    s = tl.load(s_ptr + rn_w * stride_sn + g * stride_sk, mask=g * WPG < kw_end, other=0)
    return words, s


@triton.jit
def _w4_step_act(a_ptr, rows, kw, kw_end, stride_am, stride_ak, EVEN: tl.constexpr, ROWS: tl.constexpr,
                 BLOCK_W: tl.constexpr):  # fmt: skip
    """Step kw's activation tile, shaped for _tile_groups; masked off past kw_end unless EVEN."""
    offs_w = kw + tl.arange(0, BLOCK_W)
    cols = (offs_w[:, None] * 8 + tl.arange(0, 8)[None, :]) * stride_ak  # [BLOCK_W, 8]
    if ROWS == 1:
        a_ptrs = a_ptr + rows * stride_am + cols
    else:  # each row against its own weight rows (rn_w [ROWS, BLOCK_N, 1])
        a_ptrs = a_ptr + rows[:, None, None] * stride_am + cols[None, :, :]
    if EVEN:
        a8 = tl.load(a_ptrs)
    else:
        a8 = tl.load(a_ptrs, mask=(offs_w < kw_end)[:, None], other=0.0)
    if ROWS == 1:
        a8 = a8[None, :, :]
    else:
        a8 = a8[:, None, :, :]
    return a8


@triton.jit
def _w4_step_loads(a_ptr, rows, w_ptr, s_ptr, rn_w, kw, kw_end, stride_am, stride_ak, stride_wn, stride_sn, stride_sk,
                   GROUP_K: tl.constexpr, EVEN: tl.constexpr, ROWS: tl.constexpr, BLOCK_W: tl.constexpr):  # fmt: skip
    """Step kw's loads (w4_row_dot's LOADS 1 / 2, MXFP4): words, the activation tile (shaped for
    _tile_groups) and the e8m0 scales; masked off past kw_end unless EVEN."""
    words, s = w4_step_weights(w_ptr, s_ptr, rn_w, kw, kw_end, stride_wn, stride_sn, stride_sk, GROUP_K, EVEN,
                               BLOCK_W)  # fmt: skip
    a8 = _w4_step_act(a_ptr, rows, kw, kw_end, stride_am, stride_ak, EVEN, ROWS, BLOCK_W)
    return words, a8, s


@triton.jit
def _w4_row_dot_ahead(a_ptr, rows, w_ptr, s_ptr, rn, k_end, stride_am, stride_ak, stride_wn, stride_sn, stride_sk,
                      FP4_BITS: tl.constexpr, GROUP_K: tl.constexpr, EVEN: tl.constexpr, ROWS: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, AHEAD: tl.constexpr, FIRST: tl.constexpr,
                      words0, s0, A_EXP: tl.constexpr = 0):  # fmt: skip
    """w4_row_dot's MXFP4 sum over [0, k_end) (k_end > 0) with each step's loads at its top (AHEAD: a
    step early, the next step's loads before this step's decode; the step past the end reloads the last
    one when EVEN, is masked off otherwise). FIRST: step 0's words and scales are words0 / s0, loaded
    by the caller (w4_step_weights), its activation here."""
    WPG: tl.constexpr = GROUP_K // 8
    GPI: tl.constexpr = BLOCK_W // WPG if BLOCK_W > WPG else 1
    kw_end = k_end // 8
    rn_w = tl.expand_dims(rn, len(rn.shape))  # [..., BLOCK_N, 1]
    if ROWS == 1:
        acc = tl.zeros((BLOCK_N, GPI), tl.float32)
    else:
        acc = tl.zeros((ROWS, BLOCK_N, GPI), tl.float32)
    # FP4_HALF2: step 0's weights in flight before the pass over the rows for their factors (it would delay the
    # weight stream's start), then as though the caller had loaded them (FIRST)
    PEEL: tl.constexpr = FIRST or FP4_BITS >= _HALF2
    if PEEL and not FIRST:
        words0, s0 = w4_step_weights(w_ptr, s_ptr, rn_w, 0, kw_end, stride_wn, stride_sn, stride_sk, GROUP_K, EVEN,
                                     BLOCK_W)  # fmt: skip
    a_scale, out_scale = _row_scales(a_ptr, rows, 0, k_end, stride_am, stride_ak, True, FP4_BITS, ROWS, A_EXP)
    start = 0
    if AHEAD:
        if PEEL:
            words, s = words0, s0
            a8 = _w4_step_act(a_ptr, rows, 0, kw_end, stride_am, stride_ak, EVEN, ROWS, BLOCK_W)
        else:
            words, a8, s = _w4_step_loads(a_ptr, rows, w_ptr, s_ptr, rn_w, 0, kw_end, stride_am, stride_ak, stride_wn,
                                          stride_sn, stride_sk, GROUP_K, EVEN, ROWS, BLOCK_W)  # fmt: skip
    elif PEEL:  # step 0 on the weights loaded above (or by the caller), then the loop from step 1
        a8 = _w4_step_act(a_ptr, rows, 0, kw_end, stride_am, stride_ak, EVEN, ROWS, BLOCK_W)
        acc += _tile_groups(words0, a8, s0, s0, None, True, FP4_BITS, GPI, BLOCK_W, True, a_scale)
        start = BLOCK_W
    for kw in range(start, kw_end, BLOCK_W):
        if AHEAD:
            kw_next = kw + BLOCK_W
            if EVEN:  # in bounds: past the end, this step again (written so that it stays a multiple of BLOCK_W)
                kw_next = kw + BLOCK_W * (kw_next < kw_end).to(tl.int32)
            n_words, n_a8, n_s = _w4_step_loads(a_ptr, rows, w_ptr, s_ptr, rn_w, kw_next, kw_end, stride_am, stride_ak,
                                                stride_wn, stride_sn, stride_sk, GROUP_K, EVEN, ROWS, BLOCK_W)  # fmt: skip
        else:
            words, a8, s = _w4_step_loads(a_ptr, rows, w_ptr, s_ptr, rn_w, kw, kw_end, stride_am, stride_ak, stride_wn,
                                          stride_sn, stride_sk, GROUP_K, EVEN, ROWS, BLOCK_W)  # fmt: skip
        acc += _tile_groups(words, a8, s, s, None, True, FP4_BITS, GPI, BLOCK_W, True, a_scale)
        if AHEAD:
            words, a8, s = n_words, n_a8, n_s
    # (a split of ragged K into whole unmasked steps and a masked tail after the loop counted ~40 fewer instructions
    # a step at gpt-oss's tiles, but made the decode layer's window slower under PDL on an H100: 37.8 -> 45.6 us in
    # half pairs, 42.6 -> 42.8 in float32; experiments/moe/README.md, session 35)
    return tl.sum(acc, axis=len(acc.shape) - 1) * out_scale


@triton.jit
def w4_gemv_kernel(
    a_ptr, w_ptr, c_ptr, bias_ptr, s_ptr, z_ptr, ws_ptr,
    M, N, K, K_PER_SPLIT,
    stride_am, stride_ak, stride_wn, stride_cm, stride_cn, stride_sn, stride_sk,
    FP4: tl.constexpr, FP4_BITS: tl.constexpr, GROUP_K: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN: tl.constexpr,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """c[rows, n] = sum_k a[rows, k] w[n, k] (+ bias) for BLOCK_M rows (program axis 0 modulo the row
    blocks: the programs of one weight tile are neighbours), BLOCK_N columns and one K split (axis 1);
    the epilogue is the GEMM family's (gemm_scales.epilogue)."""
    pdl_wait(PDL)
    pid = tl.program_id(0)
    row_blocks = tl.cdiv(M, BLOCK_M)
    offs_m = (pid % row_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    rm = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    offs_n = (pid // row_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    k_start = tl.program_id(1) * K_PER_SPLIT
    k_end = tl.minimum(K, k_start + K_PER_SPLIT)
    if BLOCK_M == 1:
        acc = w4_row_dot(a_ptr, (pid % M).to(tl.int64), None, w_ptr, s_ptr, z_ptr, rn, k_start, k_end, stride_am,
                         stride_ak, stride_wn, stride_sn, stride_sk, FP4, FP4_BITS, GROUP_K, EVEN, 1, BLOCK_N,
                         BLOCK_W)[None, :]  # fmt: skip
    else:
        acc = w4_row_dot(a_ptr, rm, offs_m < M, w_ptr, s_ptr, z_ptr, rn, k_start, k_end, stride_am, stride_ak,
                         stride_wn, stride_sn, stride_sk, FP4, FP4_BITS, GROUP_K, EVEN, BLOCK_M, BLOCK_N,
                         BLOCK_W)  # fmt: skip
    epilogue(acc, c_ptr, bias_ptr, s_ptr, s_ptr, ws_ptr, offs_m, offs_n, rm, rn, M, N, tl.program_id(1),
             stride_cm, stride_cn, 0, 0, 0, 0, HAS_BIAS, SPLIT_K)  # fmt: skip


def as_words(b: torch.Tensor) -> torch.Tensor | None:
    """The int32 view of packed 4-bit weights (uint8 [..., N, K / 2], rows contiguous), or None where
    the bytes cannot be read as words (row length or offsets not a multiple of 4 bytes)."""
    if b.stride(-1) != 1 or b.shape[-1] % 4 or any(s % 4 for s in b.stride()[:-1]) or b.storage_offset() % 4:
        return None
    return b.view(torch.int32)


def w4_gemv_fits(k: int, group_k: int, block_k: int) -> bool:
    """Whether the word GEMV takes this shape: K and the group whole words, BLOCK_K (8 x BLOCK_W) and
    the group dividing one another."""
    return k % 8 == 0 and group_k % 8 == 0 and block_k % 8 == 0 and (block_k % group_k == 0 or group_k % block_k == 0)
