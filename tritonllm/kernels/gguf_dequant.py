"""GGUF quantized blocks decoded in Triton, once at load: into a float matrix, or into the grouped
integer planes the quantized GEMMs read (kernels/quant_formats.py).

Input: raw uint8 [R, C / QK * TS], a tensor's bytes as the file stores them: each row of the [R, C]
matrix is C / QK blocks of TS bytes (gguf's GGML_QUANT_SIZES; rows never share a block). Every
type reads as w = (q - zero) * scale, an unsigned integer q per element and a (scale, zero) per
sub-block of `SUB` columns (d, dmin: a block's fp16 scales; sc, m: a sub-block's integer ones):

| type  | QK  | SUB | block layout (bytes)                      | q (bits)    | scale   | zero            |
|-------|-----|-----|-------------------------------------------|-------------|---------|-----------------|
| Q4_0  | 32  | 32  | d, 16 nibbles (j low, j + 16 high)        | 0..15 (4)   | d       | 8               |
| Q4_1  | 32  | 32  | d, m, 16 nibbles                          | 0..15 (4)   | d       | -m / d          |
| Q5_0  | 32  | 32  | d, 32 high bits, 16 nibbles               | 0..31 (5)   | d       | 16              |
| Q5_1  | 32  | 32  | d, m, 32 high bits, 16 nibbles            | 0..31 (5)   | d       | -m / d          |
| Q8_0  | 32  | 32  | d, 32 int8                                | int8 + 128  | d       | 128             |
| Q2_K  | 256 | 16  | 16 (m << 4 / sc), 64 crumbs, d, dmin      | 0..3 (2)    | d sc    | dmin m / (d sc) |
| Q3_K  | 256 | 16  | 32 high bits, 64 crumbs, 12 sc (6-bit), d | 0..7 (3)    | d (sc-32) | 4             |
| Q4_K  | 256 | 32  | d, dmin, 12 sc/m (6-bit), 128 nibbles     | 0..15 (4)   | d sc    | dmin m / (d sc) |
| Q5_K  | 256 | 32  | d, dmin, 12 sc/m, 32 high bits, 128 nibs  | 0..31 (5)   | d sc    | dmin m / (d sc) |
| Q6_K  | 256 | 16  | 128 nibbles, 64 crumbs, 16 int8 sc, d     | 0..63 (6)   | d sc    | 32              |
| MXFP4 | 32  | 32  | e8m0 e, 16 e2m1 nibbles                   | 2 x e2m1 + 12 | 2^(e-128) | 12          |

(The bit positions within a block are gguf-py's `dequantize_blocks`, which the tests compare with.)
Types with a float minimum (w = d sc q - dmin m) whose scale is 0 keep w = -dmin m exactly: scale
1, zero dmin m, q 0.

Outputs (R rows; a launcher may pass row slices of a larger tensor):
- float: w [R, C] in the output's dtype;
- planes: q uint8 [R, C], or two a byte [R, C / 2] (even column in the low nibble) for types of at
  most 4 bits; scale, zero float32 [R, C / G], where G divides the type's sub-block (16 or 32): a
  fused layer whose shards have different types decodes them all at the smallest sub-block;
- mx (MXFP4 only): the e2m1 nibbles [R, C / 2] (even column low) and e8m0 bytes [R, C / 32], as
  the OCP MX layout stores them (GGUF pairs column j with j + 16 in a byte instead).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from tritonllm import platform  # noqa: F401  (switches on the interpreter on CPU first)

Q = GGMLQuantizationType
# type -> (bits of q, sub-block columns): what the planes of a type (or a mix of types) need
DECODED_TYPES: dict[GGMLQuantizationType, tuple[int, int]] = {
    Q.Q4_0: (4, 32), Q.Q4_1: (4, 32), Q.Q5_0: (5, 32), Q.Q5_1: (5, 32), Q.Q8_0: (8, 32),
    Q.Q2_K: (2, 16), Q.Q3_K: (3, 16), Q.Q4_K: (4, 32), Q.Q5_K: (5, 32), Q.Q6_K: (6, 16),
    Q.MXFP4: (5, 32),
}  # fmt: skip
_FLOAT, _PLANES, _MX = 0, 1, 2
BLOCK_ROWS, BLOCK_COLS = 32, 256


@triton.jit
def _byte(ptr, mask):
    return tl.load(ptr, mask=mask, other=0).to(tl.int32)


@triton.jit
def _half(ptr, mask):
    """The little-endian fp16 at ptr, as float32."""
    bits = _byte(ptr, mask) | (_byte(ptr + 1, mask) << 8)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _with_min(q, scale, offset):
    """w = scale * q - offset as (q, scale, zero)."""
    is_zero = scale == 0.0
    zero = tl.where(is_zero, offset, offset / tl.where(is_zero, 1.0, scale))
    return tl.where(is_zero, 0, q), tl.where(is_zero, 1.0, scale), zero


@triton.jit
def _k_scale_min(sp, j, mask):
    """Q4_K / Q5_K: sub-block j's 6-bit scale and min from the 12 packed bytes at sp."""
    lo = j < 4
    a = _byte(sp + tl.where(lo, j, j + 4), mask)
    b = _byte(sp + tl.where(lo, j, j - 4), mask)
    c = _byte(sp + j + 4, mask)
    d = _byte(sp + j, mask)
    sc = tl.where(lo, a & 63, (a & 0xF) | ((b >> 2) & 0x30))
    mn = tl.where(lo, c & 63, (c >> 4) | ((d >> 2) & 0x30))
    return sc, mn


@triton.jit
def _decode(blk, e, mask, QTYPE: tl.constexpr, MX_RAW: tl.constexpr):
    """(q int32, scale, zero float32) of element e (0..QK-1) of the block at blk."""
    if QTYPE == 8:  # Q8_0
        q = _byte(blk + 2 + e, mask) ^ 0x80
        scale, zero = _half(blk, mask), tl.full(e.shape, 128.0, tl.float32)
    elif QTYPE == 2:  # Q4_0
        q = (_byte(blk + 2 + e % 16, mask) >> (4 * (e // 16))) & 0xF
        scale, zero = _half(blk, mask), tl.full(e.shape, 8.0, tl.float32)
    elif QTYPE == 3:  # Q4_1
        q = (_byte(blk + 4 + e % 16, mask) >> (4 * (e // 16))) & 0xF
        q, scale, zero = _with_min(q, _half(blk, mask), -_half(blk + 2, mask))
    elif QTYPE == 6:  # Q5_0
        high = (_byte(blk + 2 + e // 8, mask) >> (e % 8)) & 1
        q = ((_byte(blk + 6 + e % 16, mask) >> (4 * (e // 16))) & 0xF) | (high << 4)
        scale, zero = _half(blk, mask), tl.full(e.shape, 16.0, tl.float32)
    elif QTYPE == 7:  # Q5_1
        high = (_byte(blk + 4 + e // 8, mask) >> (e % 8)) & 1
        q = ((_byte(blk + 8 + e % 16, mask) >> (4 * (e // 16))) & 0xF) | (high << 4)
        q, scale, zero = _with_min(q, _half(blk, mask), -_half(blk + 2, mask))
    elif QTYPE == 10:  # Q2_K
        s = _byte(blk + e // 16, mask)
        q = (_byte(blk + 16 + (e // 128) * 32 + e % 32, mask) >> (2 * ((e % 128) // 32))) & 3
        q, scale, zero = _with_min(q, _half(blk + 80, mask) * (s & 0xF), _half(blk + 82, mask) * (s >> 4))
    elif QTYPE == 11:  # Q3_K
        j = e // 16
        low = (_byte(blk + 96 + j % 8, mask) >> (4 * (j // 8))) & 0xF
        high = (_byte(blk + 104 + j % 4, mask) >> (2 * (j // 4))) & 3
        crumb = (_byte(blk + 32 + (e // 128) * 32 + e % 32, mask) >> (2 * ((e % 128) // 32))) & 3
        q = crumb + 4 * ((_byte(blk + e % 32, mask) >> (e // 32)) & 1)
        scale = _half(blk + 108, mask) * ((low | (high << 4)) - 32)
        zero = tl.full(e.shape, 4.0, tl.float32)
    elif QTYPE == 12:  # Q4_K
        sc, mn = _k_scale_min(blk + 4, e // 32, mask)
        q = (_byte(blk + 16 + (e // 64) * 32 + e % 32, mask) >> (4 * ((e % 64) // 32))) & 0xF
        q, scale, zero = _with_min(q, _half(blk, mask) * sc, _half(blk + 2, mask) * mn)
    elif QTYPE == 13:  # Q5_K
        sc, mn = _k_scale_min(blk + 4, e // 32, mask)
        low = (_byte(blk + 48 + (e // 64) * 32 + e % 32, mask) >> (4 * ((e % 64) // 32))) & 0xF
        q = low | (((_byte(blk + 16 + e % 32, mask) >> (e // 32)) & 1) << 4)
        q, scale, zero = _with_min(q, _half(blk, mask) * sc, _half(blk + 2, mask) * mn)
    elif QTYPE == 14:  # Q6_K
        low = (_byte(blk + (e // 128) * 64 + e % 64, mask) >> (4 * ((e % 128) // 64))) & 0xF
        high = (_byte(blk + 128 + (e // 128) * 32 + e % 32, mask) >> (2 * ((e % 128) // 32))) & 3
        q = low | (high << 4)
        sc = _byte(blk + 192 + e // 16, mask)
        scale = _half(blk + 208, mask) * tl.where(sc >= 128, sc - 256, sc)
        zero = tl.full(e.shape, 32.0, tl.float32)
    else:  # MXFP4
        exponent = _byte(blk, mask)
        code = (_byte(blk + 1 + e % 16, mask) >> (4 * (e // 16))) & 0xF
        if MX_RAW:
            q, scale, zero = code, exponent.to(tl.float32), tl.zeros(e.shape, tl.float32)
        else:
            # twice the e2m1 value (0, 1, 2, 3, 4, 6, 8, 12), signed; half the e8m0 scale, as ggml
            # builds it (its two smallest exponents as float32 subnormals)
            mag = code & 7
            doubled = tl.where(mag < 4, mag, (2 + (mag & 1)) << tl.maximum((mag >> 1) - 1, 0))
            q = tl.where(code >= 8, -doubled, doubled) + 12
            bits = tl.where(exponent < 2, 0x00200000 << exponent, (exponent - 1) << 23)
            scale, zero = bits.to(tl.float32, bitcast=True), tl.full(e.shape, 12.0, tl.float32)
    return q, scale, zero


@triton.jit
def _gguf_decode_kernel(
    raw_ptr, w_ptr, q_ptr, scale_ptr, zero_ptr, rows, cols, raw_stride, out_stride, scale_stride,
    QTYPE: tl.constexpr, QK: tl.constexpr, TS: tl.constexpr, OUT: tl.constexpr, PACK: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """One program per BLOCK_R rows x BLOCK_C columns (BLOCK_C / 2 bytes of output when PACK: the
    even and odd columns are decoded apart and joined in one byte)."""
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)[:, None]
    j = tl.program_id(1) * (BLOCK_C // PACK) + tl.arange(0, BLOCK_C // PACK)[None, :]
    out = tl.zeros([BLOCK_R, BLOCK_C // PACK], tl.int32)
    for p in tl.static_range(PACK):
        col = j * PACK + p
        mask = (r < rows) & (col < cols)
        blk = raw_ptr + r * raw_stride + (col // QK) * TS
        q, scale, zero = _decode(blk, col % QK, mask, QTYPE, OUT == 2)
        if OUT == 0:
            w = (q.to(tl.float32) - zero) * scale
            tl.store(w_ptr + r * out_stride + col, w.to(w_ptr.dtype.element_ty), mask=mask)
        else:
            out |= q << (4 * p)
            if p == 0:
                at_group = mask & (col % GROUP == 0)
                offs = r * scale_stride + col // GROUP
                tl.store(scale_ptr + offs, scale.to(scale_ptr.dtype.element_ty), mask=at_group)
                if OUT == 1:
                    tl.store(zero_ptr + offs, zero, mask=at_group)
    if OUT != 0:
        tl.store(q_ptr + r * out_stride + j, out.to(tl.uint8), mask=(r < rows) & (j * PACK < cols))


def _launch(raw: torch.Tensor, qtype: GGMLQuantizationType, cols: int, out, q, scale, zero, mode, pack, group):
    if qtype not in DECODED_TYPES:
        raise ValueError(f"GGUF type {qtype.name} has no Triton decoder (decoded: {[t.name for t in DECODED_TYPES]})")
    qk, ts = GGML_QUANT_SIZES[qtype]
    rows = raw.shape[0]
    if raw.dtype != torch.uint8 or raw.dim() != 2 or cols % qk or raw.shape[1] != cols // qk * ts:
        raise ValueError(f"{qtype.name} bytes {tuple(raw.shape)} {raw.dtype} do not hold rows of {cols} values")
    if raw.stride(1) != 1:
        raise ValueError("the block bytes must be contiguous along each row")
    dest = out if mode == _FLOAT else q
    grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(cols, BLOCK_COLS))
    _gguf_decode_kernel[grid](
        raw, out, q, scale, zero, rows, cols, raw.stride(0), dest.stride(0),
        scale.stride(0) if scale is not None else 0,
        QTYPE=int(qtype), QK=qk, TS=ts, OUT=mode, PACK=pack, GROUP=group, BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS,
        num_warps=8,
    )  # fmt: skip


def dequantize_gguf(raw: torch.Tensor, qtype: GGMLQuantizationType, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """raw uint8 [R, C / QK * TS] on the target device -> w [R, C = cols] in `dtype`."""
    out = torch.empty(raw.shape[0], cols, dtype=dtype, device=raw.device)
    _launch(raw, qtype, cols, out, None, None, None, _FLOAT, 1, 1)
    return out


def decode_gguf_planes(
    raw: torch.Tensor,
    qtype: GGMLQuantizationType,
    cols: int,
    q: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor | None,
    group: int,
) -> None:
    """Write raw's R rows of `cols` values into grouped-integer planes: q uint8 [R, C] or packed [R, C / 2] (types of
    at most 4 bits only), scale and zero float32 [R, C / group]; with zero None (MXFP4 only), the MX
    layout: q the e2m1 nibbles [R, C / 2], scale the e8m0 bytes uint8 [R, C / 32]. Row slices of
    larger planes are fine (rows contiguous)."""
    bits, sub = DECODED_TYPES.get(qtype, (0, 0))
    pack = 2 if q.shape[1] * 2 == cols else 1
    if zero is None:
        if qtype != Q.MXFP4:
            raise ValueError(f"the MX layout holds MXFP4 weights, not {qtype.name}")
        mode, group = _MX, 32
    else:
        mode = _PLANES
        if pack == 2 and bits > 4:
            raise ValueError(f"{qtype.name} values take {bits} bits: they do not pack two a byte")
        if sub % group:
            raise ValueError(f"{qtype.name} sub-blocks of {sub} columns do not split into groups of {group}")
    for t in (q, scale, zero):
        if t is not None and (t.shape[0] != raw.shape[0] or t.stride(1) != 1):
            raise ValueError(f"the output planes must have {raw.shape[0]} rows, contiguous along each")
    _launch(raw, qtype, cols, None, q, scale, zero, mode, pack, group)
