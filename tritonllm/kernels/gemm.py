"""The GEMM family: one Triton kernel for every linear layer's precision.

    c[M, N] = (a[M, K] @ b[N, K]^T) * scales + bias

a is the activations (bf16/fp16/fp32, or FP8 e4m3 / int8 after kernels/quant.py), b the weight in
HF's layout [N, K] (row-major, K contiguous: each tile is read as [BLOCK_K, BLOCK_N] through
strides, no transposed copy), c [M, N] in the model's dtype, bias [N]. Scale layouts follow
kernels/quant_formats.py:

- A_SCALE: 0 none; 1 one float32 for all rows (static); 2 float32 per row [M, 1]; 3 per row and
  K-group [M, K / GROUP_K] (float32, or e8m0 uint8 when E8M0).
- B_SCALE: 0 none; 2 float32 per column [N]; 3 per (N-group, K-group) [cdiv(N, GROUP_N), K / GROUP_K]
  (block-FP8: 128 x 128; MX: GROUP_N 1, GROUP_K 32, e8m0).

Row/column scales (1, 2) multiply the accumulator once, in the epilogue; K-grouped float32 scales
(3, block-FP8) multiply each K tile's partial product as it is accumulated (BLOCK_K divides
GROUP_K, so a tile lies in one group); e8m0 (MX) scales multiply the operands themselves, which
are widened to bf16 for the dot (OPERAND_SCALES: no MX tensor cores before Blackwell, and exact,
since bf16 holds any e4m3 value times any power of two). int8 x int8 accumulates in int32. Weight-only (UPCAST_B): an FP8/int8 weight
tile is widened to a's dtype before the dot (W8A16); a decoded tile (B_DECODE, gemm_scales.DEC_*:
int4 pairs [N, K / 2] or 8-bit values [N, K] with per-group scales and zero points, (q - zero) *
scale; MXFP4 e2m1 pairs with e8m0 scales per 32) is unpacked and dequantized in registers, each
group's scale loaded once per tile and broadcast over the group (W4A16 / W8A16).

Tiles come from per-GPU tables by M bucket (`GEMM_TABLES`: no autotuning in the serving path);
tiles are visited in grouped order (GROUP_M rows of tiles share B columns in L2). Skinny M
(decode, M <= 64) splits K over programs when the tiles alone would leave SMs idle: each split
writes float32 partials (scales applied) to a workspace [SPLIT_K, M, N] that a second kernel sums,
adding the bias (deterministic, no atomics, graph-capturable).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import triton
import triton.language as tl

from tritonllm import platform
from tritonllm.kernels import (
    gemm_block_sm90,
    gemm_skinny_sm90,
    gemm_w4_sm90,
    gemm_w4_tma_sm90,
    gemv_w4_sm90,
    gemv_w4_tma_sm90,
    splitk_sm90,
)
from tritonllm.kernels.gemm_dequant import dequantize
from tritonllm.kernels.gemm_gemv import gemv_kernel
from tritonllm.kernels.gemm_persistent import descriptors_fit, gemm_persistent_kernel, tile_coords
from tritonllm.kernels.gemm_scales import (
    DEC_FP4,
    DEC_INT4,
    DEC_NONE,
    DEC_UINT8,
    dequant_values,
    e4m3fn_bits_to_float,
    e8m0_to_float,
    epilogue,
    group_scales,
    unpack_values,
)
from tritonllm.kernels.gemv_w4 import FP4_BITS, as_words, w4_gemv_fits, w4_gemv_kernel
from tritonllm.kernels.launch import pdl_launch, pdl_wait
from tritonllm.kernels.quant_formats import BLOCK, FP4, FP8_DTYPES, INT4, MX_GROUP, QuantScheme

try:  # triton >= 3.4: host-side tensor descriptors (TMA on Hopper)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the pointer kernel only
    TensorDescriptor = None

A_NONE, A_TENSOR, A_ROW, A_GROUP = 0, 1, 2, 3
B_NONE, B_COLUMN, B_GROUP = 0, 2, 3
_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}
# a scheme's activation scales (quant_formats.py) as gemm() reads them
ACT_SCALE_KINDS = {"none": A_NONE, "tensor": A_TENSOR, "token": A_ROW, "group": A_GROUP, "mx": A_GROUP}
# weight dtypes (quant_formats.py) that the kernels decode per group before the dot (weight-only)
SCHEME_DECODE = {INT4: DEC_INT4, torch.uint8: DEC_UINT8, FP4: DEC_FP4}


def scale_args(scheme: QuantScheme) -> dict:
    """gemm()'s scale arguments for operands quantized per `scheme`: how the activations' and the
    weight's scales are laid out, and the weight's scale groups."""
    group_k, group_n = {"block": (BLOCK, BLOCK), "mx": (MX_GROUP, 1), "group": (scheme.group_size, 1)}.get(
        scheme.weight_scale, (0, 1)
    )
    return dict(
        a_scale_kind=ACT_SCALE_KINDS[scheme.act],
        b_scale_kind=B_GROUP if scheme.weight_scale in ("block", "mx", "group") else B_COLUMN,
        group_k=group_k,
        group_n=group_n,
        b_decode=SCHEME_DECODE.get(scheme.weight_dtype, DEC_NONE) if scheme.act == "none" else DEC_NONE,
    )


@triton.jit
def gemm_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, b_zero_ptr, ws_ptr,
    M, N, K, K_PER_SPLIT,
    stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
    stride_asm, stride_ask, stride_bsn, stride_bsk,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr,
    E8M0: tl.constexpr, UPCAST_B: tl.constexpr, INT_ACC: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    OPERAND_SCALES: tl.constexpr, DOT_DTYPE: tl.constexpr, B_E4M3FN_BITS: tl.constexpr, B_DECODE: tl.constexpr,
    EVEN_K: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_wait(PDL)
    pid_k = tl.program_id(1)
    # grouped order: GROUP_M consecutive tile rows sweep the tile columns together (B reuse in L2)
    pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # out-of-range rows/columns read row/column 0 instead of being masked; their results are dropped
    rm = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    rn = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    PACK: tl.constexpr = 2 if (B_DECODE == DEC_INT4 or B_DECODE == DEC_FP4) else 1  # K values per byte of B
    offs_kb = tl.arange(0, BLOCK_K // PACK)
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(K, k_start + K_PER_SPLIT)
    a_ptrs = a_ptr + rm[:, None] * stride_am + (k_start + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + rn[None, :] * stride_bn + (k_start // PACK + offs_kb)[:, None] * stride_bk
    K_GROUPED: tl.constexpr = (A_SCALE == 3 or B_SCALE == 3) and not OPERAND_SCALES and B_DECODE == DEC_NONE
    if K_GROUPED:  # the first K tile's group scales; each iteration loads the next tile's (prefetch)
        a_s, b_s = group_scales(a_scale_ptr, b_scale_ptr, rm, rn, k_start // GROUP_K, stride_asm, stride_ask,
                                 stride_bsn, stride_bsk, A_SCALE, B_SCALE, GROUP_N, E8M0)  # fmt: skip
    if INT_ACC:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=(k + offs_k < k_end)[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=(k // PACK + offs_kb < k_end // PACK)[:, None], other=0.0)
        if UPCAST_B:
            if B_DECODE != DEC_NONE:  # int4 / 8-bit with group scales and zero points, or MXFP4
                b = unpack_values(b, B_DECODE, BLOCK_K, BLOCK_N, 1)
                b = dequant_values(b, b_scale_ptr, b_zero_ptr, rn, k, k_end, stride_bsn, stride_bsk,
                                   B_DECODE, GROUP_K, BLOCK_K, BLOCK_N, 1, 1).to(a.dtype)  # fmt: skip
            elif B_E4M3FN_BITS:  # e4m3fn weights as bytes: no FP8 conversion on this GPU
                b = e4m3fn_bits_to_float(b).to(a.dtype)
            else:
                b = b.to(a.dtype)
        if OPERAND_SCALES:
            # MX on GPUs without MX tensor cores: each element times its group's power-of-two scale,
            # in DOT_DTYPE (exact: bf16 holds e4m3 values times any e8m0 scale), one dot. The tile's
            # BLOCK_K / GROUP_K scales per row (column) are loaded once and broadcast over their group.
            GROUPS: tl.constexpr = BLOCK_K // GROUP_K
            gi = k // GROUP_K + tl.arange(0, GROUPS)
            in_groups = gi * GROUP_K < k_end
            a_s = tl.load(a_scale_ptr + rm[:, None] * stride_asm + gi[None, :] * stride_ask,
                          mask=in_groups[None, :], other=127)  # fmt: skip
            b_s = tl.load(b_scale_ptr + (rn // GROUP_N)[None, :] * stride_bsn + gi[:, None] * stride_bsk,
                          mask=in_groups[:, None], other=127)  # fmt: skip
            a_s = tl.reshape(
                tl.broadcast_to(e8m0_to_float(a_s)[:, :, None], (BLOCK_M, GROUPS, GROUP_K)), (BLOCK_M, BLOCK_K)
            )
            b_s = tl.reshape(
                tl.broadcast_to(e8m0_to_float(b_s)[:, None, :], (GROUPS, GROUP_K, BLOCK_N)), (BLOCK_K, BLOCK_N)
            )
            a = a.to(DOT_DTYPE) * a_s.to(DOT_DTYPE)
            b = b.to(DOT_DTYPE) * b_s.to(DOT_DTYPE)
            acc = tl.dot(a, b, acc)
        elif K_GROUPED:
            # the next K tile's scales are loaded before this tile's dot (the last loads group 0 again,
            # unused): their latency hides behind the MMA instead of stalling the rescale after it
            nxt = tl.where(k + BLOCK_K < k_end, (k + BLOCK_K) // GROUP_K, 0)
            a_s_next, b_s_next = group_scales(a_scale_ptr, b_scale_ptr, rm, rn, nxt, stride_asm, stride_ask,
                                               stride_bsn, stride_bsk, A_SCALE, B_SCALE, GROUP_N, E8M0)  # fmt: skip
            part = tl.dot(a, b)
            if A_SCALE == 3:
                part = part * a_s[:, None]
            if B_SCALE == 3:
                part = part * b_s[None, :]
            acc += part
            a_s, b_s = a_s_next, b_s_next
        elif INT_ACC:
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        elif IEEE:  # float32 operands: full precision, not TF32 (tests, float32 models)
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += (BLOCK_K // PACK) * stride_bk

    epilogue(acc, c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, ws_ptr, offs_m, offs_n, rm, rn, M, N, pid_k,
             stride_cm, stride_cn, stride_asm, stride_bsn, A_SCALE, B_SCALE, HAS_BIAS, SPLIT_K)  # fmt: skip


@triton.jit
def split_k_reduce_kernel(
    ws_ptr, c_ptr, bias_ptr, M, N, stride_cm, stride_cn,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """c[m, n] = sum over splits of ws[s, m, n] (+ bias[n]), in c's dtype."""
    pdl_wait(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLIT_K):
        total += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0)
    n = offs % N
    if HAS_BIAS:
        total += tl.load(bias_ptr + n, mask=mask, other=0.0).to(tl.float32)
    m = offs // N
    tl.store(c_ptr + m.to(tl.int64) * stride_cm + n * stride_cn, total.to(c_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class GemmTiles:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8
    max_split_k: int = 1  # skinny M: split K up to this many ways when tiles leave SMs idle
    # large M: the persistent tensor-descriptor kernel (kernels/gemm_persistent.py) for float, W8A8
    # row/column-scaled and block-FP8 GEMMs (the pointer kernel where descriptors cannot be used)
    persistent: bool = False
    # decode-sized M: the GEMV kernel (kernels/gemm_gemv.py; block_m 1), where a tile would pad rows to 16
    gemv: bool = False
    # large M with decoded weights (int4, 8-bit grouped, MXFP4): dequantize the weight to the activations'
    # dtype in one pass, then the float GEMM with its own table's tiles (kernels/gemm_dequant.py)
    dequant: bool = False


# One row of 4-bit weights (decode at batch 1) on GPUs and shapes without a tuned entry: the word GEMV
# (kernels/gemv_w4.py) at the H200 table's M = 1 tiles (16 rows x 1024 columns, K split up to 4 ways), where
# the 16-row tile kernel ran 0.66-0.79x bf16 cuBLAS for MXFP4 on an H100 (experiments/moe/README.md, session 31)
W4_GEMV_TILES = GemmTiles(1, 16, 1024, 4, 2, 1, 4, gemv=True)
# Per GPU family and kernel kind, (largest M, tiles) by M bucket, in increasing M. Kinds: "float"
# (bf16/fp16/fp32), "w8a8" (FP8 or int8 both operands, row/column scales), "block" (K-grouped
# scales: block-FP8, MX; BLOCK_K is capped at the group), "weight_only" (FP8/int8 weight widened, or
# 8-bit values decoded per group), "w4a16" (4-bit weights decoded per group: int4, MXFP4).
# Hopper: M <= 64 and M >= 1024 from scripts/tune_gemm.py on the H200 (experiments/gemm/): large M
# takes the persistent descriptor kernel with 128 x 256 tiles (0.97-1.15x cuBLAS bf16 where the
# pointer kernel reached 0.63-0.77x); block-FP8 64 x 128 tiles, four warps (three CTAs per SM hide
# each other's per-K-tile rescale); skinny buckets favour wide K tiles and split-K (the weight read
# is the cost). The 512 buckets (M = 257..512: prefill chunks, a batch-1 prompt) are the tiles whose sum over
# Llama-3-8B's four layers was least in the mid sweeps (scripts/tune_gemm.py --suites mid / mid_fp8): 128 x 128
# (bf16 on the H200 354.7 us a layer against 456.7 for the 128 x 256 persistent tiles, whose 64 tiles leave SMs
# idle at N = 4,096; FP8 on an H100 203.0 against 239.1; experiments/gemm/README.md, session 44). The 128/256
# buckets and weight-only are the Triton tutorial's starting points; decoded
# weights (int4, 8-bit grouped, MXFP4) beyond M = 64 are dequantized first, then multiplied in bf16
# (H200 sweep: at M = 256 and 1024 dequantize-then-GEMM took 0.4-0.9x the fused tile kernel's time).
_HOPPER = {
    "float": [
        (16, GemmTiles(16, 128, 128, 4, 4, 8, 4)),
        (64, GemmTiles(64, 32, 128, 4, 4, 8, 4)),
        (128, GemmTiles(64, 128, 64, 4, 4)),
        (256, GemmTiles(128, 128, 64, 8, 4)),
        (512, GemmTiles(128, 128, 64, 4, 4)),
        (None, GemmTiles(128, 256, 64, 8, 3, persistent=True)),
    ],
    "w8a8": [
        (16, GemmTiles(16, 128, 512, 4, 4, 8, 4)),
        (64, GemmTiles(64, 32, 256, 4, 4, 8, 4)),
        (128, GemmTiles(64, 128, 128, 4, 4)),
        (256, GemmTiles(128, 128, 128, 8, 4)),
        (512, GemmTiles(128, 128, 128, 8, 4, persistent=True)),
        (None, GemmTiles(128, 256, 128, 8, 3, persistent=True)),
    ],
    "block": [
        (16, GemmTiles(16, 128, 128, 4, 4, 8, 4)),
        (64, GemmTiles(64, 128, 128, 4, 4, 8, 4)),
        (None, GemmTiles(64, 128, 128, 4, 3, 32)),
    ],
    "weight_only": [
        (16, GemmTiles(16, 64, 256, 4, 4, 8, 8)),
        (64, GemmTiles(64, 64, 128, 4, 4, 8, 4)),
        (None, GemmTiles(128, 128, 64, 8, 3, dequant=True)),
    ],
    "w4a16": [
        (1, W4_GEMV_TILES),
        (16, GemmTiles(16, 64, 256, 4, 4, 8, 8)),
        (64, GemmTiles(64, 64, 128, 4, 4, 8, 4)),
        (None, GemmTiles(128, 128, 64, 8, 3, dequant=True)),
    ],
}
# Ampere and CDNA: smaller shared memory per SM (Ampere 164 KiB; MI300 64 KiB LDS), two stages on AMD
_AMPERE = {
    "float": [(32, GemmTiles(32, 64, 128, 4, 4, 8, 8)), (128, GemmTiles(64, 128, 32, 4, 4)),
              (None, GemmTiles(128, 128, 32, 8, 3))],
    "w8a8": [(32, GemmTiles(32, 64, 256, 4, 4, 8, 8)), (None, GemmTiles(128, 128, 64, 8, 3))],
    "block": [(32, GemmTiles(32, 64, 128, 4, 3, 8, 8)), (None, GemmTiles(64, 128, 128, 4, 3))],
    "weight_only": [(32, GemmTiles(32, 64, 128, 4, 4, 8, 8)), (None, GemmTiles(64, 128, 64, 4, 3))],
    "w4a16": [(1, W4_GEMV_TILES), (32, GemmTiles(32, 64, 128, 4, 4, 8, 8)), (None, GemmTiles(64, 128, 64, 4, 3))],
}  # fmt: skip
_CDNA = {
    "float": [(32, GemmTiles(32, 64, 128, 4, 2, 8, 8)), (None, GemmTiles(128, 128, 64, 8, 2, 4))],
    "w8a8": [(32, GemmTiles(32, 64, 256, 4, 2, 8, 8)), (None, GemmTiles(128, 128, 128, 8, 2, 4))],
    "block": [(32, GemmTiles(32, 64, 128, 4, 2, 8, 8)), (None, GemmTiles(128, 128, 128, 8, 2, 4))],
    "weight_only": [(32, GemmTiles(32, 64, 128, 4, 2, 8, 8)), (None, GemmTiles(128, 128, 64, 8, 2, 4))],
    "w4a16": [(1, W4_GEMV_TILES), (32, GemmTiles(32, 64, 128, 4, 2, 8, 8)), (None, GemmTiles(128, 128, 64, 8, 2, 4))],
}  # fmt: skip
# The interpreter runs each program in Python: small tiles, few programs (tests' shapes are small); 4-bit
# weights take 128-column K steps (one group of 128, or several smaller ones): half the decode steps
_CPU = {
    kind: [(None, GemmTiles(32, 64, 128 if kind == "w4a16" else 64, 1, 1, 4, 4))]
    for kind in ("float", "w8a8", "block", "weight_only", "w4a16")
}
GEMM_TABLES = {"hopper": _HOPPER, "ampere": _AMPERE, "cdna": _CDNA, "cpu": _CPU}
# shared memory (LDS) per block that the pipelined A and B tiles may take
SHARED_MEMORY_BYTES = {"hopper": 220 << 10, "ampere": 160 << 10, "cdna": 64 << 10, "cpu": 1 << 40}


# Per-shape winners of scripts/tune_gemm.py's skinny and mid sweeps (M <= TUNED_MAX_M) on one GPU model,
# read from kernels/tuned/<device name>.json (as vLLM's per-(N, K) config files): at decode sizes the best
# tiles and K splits depend on N and K, and one M-bucket entry loses up to 20% on some layer shapes; at
# prefill chunks of 128-512 rows the 128/256 buckets ran 0.65x cuBLAS on o and down (session 38, H100).
# Shapes and GPUs without an entry take the tables above.
TUNED_MAX_M = 512
TUNED_DIR = Path(__file__).parent / "tuned"


@functools.cache
def _tuned_file(device_name: str) -> dict:
    path = TUNED_DIR / f"{device_name.replace(' ', '_')}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def tuned_tiles(kind: str, m: int, n: int, k: int, device_name: str | None = None) -> tuple[GemmTiles, int] | None:
    """(tiles, K splits) tuned for this GPU (or `device_name`) and shape, from the smallest tuned
    M >= m; None where nothing was tuned, and below half the smallest tuned M: a file that holds only
    a prefill suite's buckets (128-512) must not hand its tiles to decode-sized GEMMs."""
    if m > TUNED_MAX_M or (device_name is None and not platform.is_gpu()):
        return None
    device_name = device_name or torch.cuda.get_device_name(platform.DEVICE)
    shapes = _tuned_file(device_name).get(kind, {}).get(f"{n},{k}")
    if not shapes:
        return None
    fits = [int(tm) for tm in shapes if int(tm) >= m]
    if not fits or 2 * m <= min(map(int, shapes)):
        return None
    entry = dict(shapes[str(min(fits))])
    split = entry.pop("split")
    entry.pop("us", None)
    return GemmTiles(**entry), split


def gpu_family() -> str:
    if platform.PLATFORM == "cpu":
        return "cpu"
    if platform.PLATFORM == "rocm":
        return "cdna"
    return "hopper" if torch.cuda.get_device_capability(platform.DEVICE)[0] >= 9 else "ampere"


def pick_tiles(kind: str, m: int, family: str | None = None) -> GemmTiles:
    for max_m, tiles in GEMM_TABLES[family or gpu_family()][kind]:
        if max_m is None or m <= max_m:
            return tiles
    raise AssertionError("every table ends with an open bucket")


def fit_shared_memory(tiles: GemmTiles, a_bytes: int, b_bytes: int, family: str | None = None) -> GemmTiles:
    """The tables are written for 16-bit (or 8-bit) operands: with wider ones (float32) the stages of
    A and B tiles may not fit shared memory; drop stages (to 2), then halve BLOCK_K, until they do."""
    limit = SHARED_MEMORY_BYTES[family or gpu_family()]
    need = lambda t: t.num_stages * t.block_k * (t.block_m * a_bytes + t.block_n * b_bytes)  # noqa: E731
    while need(tiles) > limit and tiles.num_stages > 2:
        tiles = replace(tiles, num_stages=tiles.num_stages - 1)
    while need(tiles) > limit and tiles.block_k > 32:
        tiles = replace(tiles, block_k=tiles.block_k // 2)
    return tiles


def _split_k(tiles: GemmTiles, m: int, n: int, k: int, k_quantum: int) -> int:
    """How many ways to split K: enough programs to cover the SMs, each split at least 4 K tiles."""
    if tiles.max_split_k <= 1:
        return 1
    programs = triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n)
    want = triton.cdiv(platform.num_multiprocessors(), programs)
    most = max(1, k // max(4 * tiles.block_k, k_quantum))
    return max(1, min(want, tiles.max_split_k, most))


@functools.lru_cache(maxsize=4096)
def plan_gemm(
    kind: str, m: int, n: int, k: int, group_k: int, a_bytes: int, b_bytes: int,
    tiles: GemmTiles | None = None, split_k: int | None = None, decode_group: int = 0,
) -> tuple[GemmTiles, int, int]:  # fmt: skip
    """(tiles, K splits, K per split) of one GEMM shape: the table's tiles for its M bucket fitted to
    shared memory, BLOCK_K capped at a scale group (`group_k`: K-grouped scales applied per tile) or
    kept a multiple of a decoded weight's group (`decode_group`, below a group that is all of K), and
    the split heuristic. Cached: a layer's call computes it once per shape, not once per launch."""
    if tiles is None and a_bytes <= 2:  # tuned for 16- and 8-bit operands
        tuned = tuned_tiles(kind, m, n, k)
        if tuned is not None:
            tiles, split_k = tuned[0], split_k if split_k is not None else tuned[1]
    tiles = tiles or fit_shared_memory(pick_tiles(kind, m), a_bytes, b_bytes)
    if group_k and tiles.block_k > group_k:
        tiles = replace(tiles, block_k=group_k)
    if decode_group and tiles.block_k > decode_group and tiles.block_k % decode_group:
        tiles = replace(tiles, block_k=max(16, 1 << (decode_group.bit_length() - 1)))
    k_quantum = max(tiles.block_k, group_k, decode_group)
    split = split_k if split_k is not None else _split_k(tiles, m, n, k, k_quantum)
    k_per_split = triton.cdiv(triton.cdiv(k, split), k_quantum) * k_quantum
    return tiles, triton.cdiv(k, k_per_split), k_per_split


def _w4_sm90(a: torch.Tensor, words: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor,
             zero: torch.Tensor | None, group_k: int, fp4: bool, sm90: str,
             out_dtype: torch.dtype | None) -> torch.Tensor | None:  # fmt: skip
    """a . w^T for a 4-bit weight (its int32 word view) on the Hopper Gluon kernels where they serve the shape
    (sm90 "always": wherever they can; "faster": where measured faster): the TMA GEMM, the GEMV at M = 1, the
    tensor-core GEMM (M = 2..64, and beyond with its row blocks where gemm_w4_sm90.MAX_M allows). None: none
    of them (the portable kernels then)."""
    (m, k), n = a.shape, words.shape[0]
    make = lambda: torch.empty((m, n), dtype=out_dtype or a.dtype, device=a.device)  # noqa: E731
    if gemm_w4_tma_sm90.measured_faster(m, n, k, fp4) and gemm_w4_tma_sm90.takes(a, words, group_k, fp4):
        return gemm_w4_tma_sm90.w4_tma_gemm_sm90(a, words, make(), bias, scale, zero, group_k, fp4, pdl_launch())
    if m == 1 and gemv_w4_tma_sm90.takes(a, words, scale, zero, group_k, fp4):  # opt-in: TRITONLLM_W4_GEMV_TMA
        return gemv_w4_tma_sm90.w4_gemv_tma_sm90(a, words, make(), bias, scale, zero, group_k, fp4, pdl_launch())
    if m == 1 and gemv_w4_sm90.takes(a, k, group_k) and (sm90 == "always" or gemv_w4_sm90.measured_faster(n, k, fp4)):
        return gemv_w4_sm90.w4_gemv_sm90(a, words, make(), bias, scale, zero, group_k, fp4, pdl_launch())
    if gemm_w4_sm90.takes(a, k, group_k, fp4) and (sm90 == "always" or gemm_w4_sm90.measured_faster(m, n, k, fp4)):
        # launched without PDL: with it, Llama-3-8B int4 decode steps took 7.55 against 6.50 ms at 64
        # sequences and 4.12 against 3.93 ms at 16 (H200, experiments/quant4/README.md, session 20)
        return gemm_w4_sm90.w4_gemm_sm90(a, words, make(), bias, scale, zero, group_k, fp4, {"PDL": False})
    return None


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    a_scale: torch.Tensor | None = None,
    b_scale: torch.Tensor | None = None,
    a_scale_kind: int = A_NONE,
    b_scale_kind: int = B_NONE,
    group_k: int = 0,
    group_n: int = 1,
    b_decode: int = DEC_NONE,
    b_zero: torch.Tensor | None = None,
    tiles: GemmTiles | None = None,
    split_k: int | None = None,
    sm90: str = "never",
) -> torch.Tensor:
    """c = (a @ b.T) * scales + bias for a [M, K], b [N, K] (module docstring); a uint8 b holds
    e4m3fn bytes, decoded in the kernel (weight-only FP8 on GPUs without FP8), or, per `b_decode`
    (gemm_scales.DEC_*), int4 pairs [N, K / 2] or 8-bit values [N, K] with per-group `b_scale` and
    `b_zero` [N, K / group_k] (w = (q - zero) * scale), or MXFP4 e2m1 pairs [N, K / 2] with e8m0
    `b_scale` [N, K / 32]; decoded weights are widened to a's dtype in the kernel. `tiles` and
    `split_k` override the table and the split heuristic (tests, tile sweeps). `sm90`: the Hopper
    Gluon kernels (a 4-bit weight's GEMV at M = 1 and tensor-core GEMM at M = 2..64; the skinny TMA
    GEMM of bf16 / fp16 / FP8 W8A8 operands at M = 1..64; the block-FP8 GEMM at M > 64) run "always"
    where they can (tests, sweeps), only where they were measured "faster" (the `triton_sm90` linear
    implementation), or "never"."""
    packed = b_decode in (DEC_INT4, DEC_FP4)
    k_b = b.shape[1] * 2 if packed else b.shape[1]
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != k_b:
        raise ValueError(f"gemm: a {tuple(a.shape)} and b {tuple(b.shape)} must be [M, K] and [N, K]"
                         + (" (4-bit: [N, K / 2])" if packed else ""))  # fmt: skip
    zeros = b_decode in (DEC_INT4, DEC_UINT8)
    if b_decode != DEC_NONE and (b.dtype != torch.uint8 or b_scale_kind != B_GROUP or a.dtype in (torch.int8, *FP8_DTYPES)
                                 or (zeros and (b_zero is None or b_zero.stride() != b_scale.stride()))):  # fmt: skip
        raise ValueError("gemm: decoded weights are uint8 with group scales (and zero points of the scales' layout)"
                         " and float activations")  # fmt: skip
    m, k = a.shape
    n = b.shape[0]
    upcast_b = b.dtype != a.dtype
    int_acc = a.dtype == torch.int8 and b.dtype == torch.int8
    k_grouped = a_scale_kind == A_GROUP or b_scale_kind == B_GROUP
    e8m0 = (a_scale is not None and a_scale.dtype == torch.uint8) or (
        b_scale is not None and b_scale.dtype == torch.uint8
    )
    if upcast_b and a.dtype in (torch.int8, *FP8_DTYPES):
        raise ValueError(f"gemm: a {a.dtype} with b {b.dtype}: W8A8 operands share a dtype")
    if k_grouped and (group_k <= 0 or k % group_k):
        raise ValueError(f"gemm: K-grouped scales need K ({k}) to be a multiple of group_k ({group_k})")
    # e8m0 (MX) scales go into the operands, which are widened for a bf16 dot: Hopper and older GPUs
    # have no MX tensor cores, and 32-deep FP8 dots rescaled one by one starve the tensor cores
    # (each K tile holds whole groups: BLOCK_K is a multiple of 32 and the K splits start at BLOCK_K multiples)
    operand_scales = e8m0 and a_scale_kind == A_GROUP and b_scale_kind == B_GROUP and b_decode == DEC_NONE
    dot_dtype = torch.float32 if platform.is_interpreter() else torch.bfloat16
    if operand_scales:
        kind = "float"  # a bf16 dot once the operands are widened
    elif packed:
        kind = "w4a16"
    elif k_grouped and b_decode == DEC_NONE:
        kind = "block"
    elif upcast_b:
        kind = "weight_only"
    else:
        kind = "w8a8" if a.dtype in (torch.int8, *FP8_DTYPES) else "float"
    if operand_scales and tiles is None:  # the float table's tiles, not the shape-tuned ones (GEMV
        tiles = fit_shared_memory(pick_tiles("float", m), a.element_size(), b.element_size())  # has no MX path)
    if operand_scales and tiles.block_k % group_k:
        raise ValueError(f"gemm: MX tiles need BLOCK_K ({tiles.block_k}) a multiple of the scale group ({group_k})")
    # decoded weights take tiles of several groups (each group's scale broadcast over it): BLOCK_K is
    # not capped at the group there, only made a multiple of it (plan_gemm's k_quantum keeps splits whole)
    cap_group = group_k if k_grouped and not operand_scales and b_decode == DEC_NONE else 0
    tiles, split, k_per_split = plan_gemm(
        kind, m, n, k, cap_group, a.element_size(), b.element_size(), tiles, split_k,
        group_k if b_decode != DEC_NONE else 0,
    )  # fmt: skip
    if b_decode != DEC_NONE and group_k != k and tiles.block_k % group_k and group_k % tiles.block_k:
        raise ValueError(f"gemm: BLOCK_K ({tiles.block_k}) and the weight's group ({group_k}) must divide one another")
    if sm90 != "never" and packed and m > 0 and n > 0 and (words := as_words(b)) is not None:
        c = _w4_sm90(a, words, bias, b_scale, b_zero if zeros else None, group_k, b_decode == DEC_FP4, sm90, out_dtype)
        if c is not None:  # Hopper: a Gluon kernel served it (before the dequantize-first tiles of M > 64)
            return c
    if tiles.dequant and b_decode != DEC_NONE:
        w = dequantize(b, b_scale, b_zero if zeros else None, k, b_decode, group_k, a.dtype)
        return gemm(a, w, bias, out_dtype=out_dtype)
    c = torch.empty((m, n), dtype=out_dtype or a.dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if (
        sm90 != "never"
        and kind in ("float", "w8a8", "block")
        and _skinny_scales(a, a_scale, b, b_scale, a_scale_kind, b_scale_kind, group_k, group_n)
        and gemm_skinny_sm90.takes(a, b)
        and (sm90 == "always" or (gemm_skinny_sm90.measured_faster(m, n, k, a.dtype) and (
            b_scale_kind != B_GROUP or gemm_skinny_sm90.BLOCK_FP8)))
    ):  # fmt: skip
        a_s = a_scale if a_scale_kind != A_NONE else None
        b_s = b_scale if b_scale_kind != B_NONE else None
        return gemm_skinny_sm90.skinny_gemm_sm90(a, b, c, bias, a_s, b_s, pdl_launch())
    if (
        sm90 != "never"
        and kind == "block"
        and gemm_block_sm90.takes(a, b, a_scale, b_scale, group_n, group_k, c.dtype)
        and (sm90 == "always" or gemm_block_sm90.measured_faster(m, n, k))
    ):
        return gemm_block_sm90.block_fp8_gemm_sm90(a, b, c, bias, a_scale, b_scale, pdl_launch())
    persistent = (
        tiles.persistent and split == 1 and not (operand_scales or upcast_b) and TensorDescriptor is not None
        and (not k_grouped or tiles.block_k == group_k) and descriptors_fit(a, b, c)
    )  # fmt: skip
    if persistent:
        return _launch_persistent(a, b, c, bias, a_scale, b_scale, a_scale_kind, b_scale_kind, group_n, int_acc, tiles)
    ws = torch.empty((split, m, n), dtype=torch.float32, device=a.device) if split > 1 else c
    dummy = c  # stands in for absent pointers (never read)
    a_s, b_s = (a_scale if a_scale is not None else dummy), (b_scale if b_scale is not None else dummy)
    a_s_strides = _scale_strides(a_scale, a_scale_kind >= A_ROW)
    b_s_strides = _scale_strides(b_scale, b_scale_kind != B_NONE)
    even_k = k % tiles.block_k == 0 and k_per_split % tiles.block_k == 0
    words = as_words(b) if tiles.gemv and packed and w4_gemv_fits(k, group_k, tiles.block_k) else None
    if words is not None:  # 4-bit weights read as words of eight nibbles (kernels/gemv_w4.py)
        w4_gemv_kernel[(triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n), split)](
            a, words, c, bias if bias is not None else dummy, b_scale, b_zero if zeros else b_scale, ws,
            m, n, k, k_per_split, a.stride(0), a.stride(1), words.stride(0), c.stride(0), c.stride(1), *b_s_strides,
            FP4=b_decode == DEC_FP4, FP4_BITS=FP4_BITS, GROUP_K=group_k, HAS_BIAS=bias is not None,
            EVEN=even_k, SPLIT_K=split, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_W=tiles.block_k // 8,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl_launch(),
        )  # fmt: skip
        return _reduce_splits(ws, c, bias, split)
    if tiles.gemv and not operand_scales:
        gemv_kernel[(m * triton.cdiv(n, tiles.block_n), split)](
            a, b, c, bias if bias is not None else dummy, a_s, b_s, b_zero if zeros else dummy, ws,
            m, n, k, k_per_split,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
            *a_s_strides, *b_s_strides,
            A_SCALE=a_scale_kind, B_SCALE=b_scale_kind, GROUP_K=max(group_k, 1), GROUP_N=group_n,
            INT_ACC=int_acc, HAS_BIAS=bias is not None, B_E4M3FN_BITS=b.dtype == torch.uint8 and b_decode == DEC_NONE,
            B_DECODE=b_decode,
            EVEN_K=even_k, SPLIT_K=split, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl_launch(),
        )  # fmt: skip
        return _reduce_splits(ws, c, bias, split)
    grid = (triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n), split)
    gemm_kernel[grid](
        a, b, c, bias if bias is not None else dummy, a_s, b_s, b_zero if zeros else dummy, ws,
        m, n, k, k_per_split,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        *a_s_strides, *b_s_strides,
        A_SCALE=a_scale_kind, B_SCALE=b_scale_kind, GROUP_K=max(group_k, 1), GROUP_N=group_n,
        E8M0=e8m0, UPCAST_B=upcast_b, INT_ACC=int_acc, HAS_BIAS=bias is not None, IEEE=a.dtype == torch.float32,
        OPERAND_SCALES=operand_scales, DOT_DTYPE=_TL_DTYPES[dot_dtype], B_DECODE=b_decode,
        B_E4M3FN_BITS=b.dtype == torch.uint8 and b_decode == DEC_NONE,
        EVEN_K=even_k, SPLIT_K=split,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl_launch(),
    )  # fmt: skip
    return _reduce_splits(ws, c, bias, split)


def _skinny_scales(a: torch.Tensor, a_scale: torch.Tensor | None, b: torch.Tensor, b_scale: torch.Tensor | None,
                   a_kind: int, b_kind: int, group_k: int, group_n: int) -> bool:  # fmt: skip
    """Whether the skinny sm90 GEMM takes these scales: float32, the activations' one, one a row or (FP8) one a
    row and 128-column group (gemm_skinny_sm90.group_scales_fit), the weight's one, one a column (contiguous) or,
    with group activations, one a 128 x 128 block (gemm_skinny_sm90.block_scales_fit: more than one along K)."""
    if a_kind not in (A_NONE, A_TENSOR, A_ROW, A_GROUP) or b_kind not in (B_NONE, B_COLUMN, B_GROUP):
        return False
    if a_kind == A_GROUP:
        groups_ok = group_k == gemm_skinny_sm90.ROW_BYTES and gemm_skinny_sm90.group_scales_fit(a, a_scale)
        if not groups_ok or splitk_sm90.scale_kind(a_scale) != splitk_sm90.SCALE_GROUP:
            return False
    if b_kind == B_GROUP:  # block-FP8: 128 x 128 weight blocks, 1 x 128 activation groups
        return (
            a_kind == A_GROUP and group_n == gemm_skinny_sm90.BLOCK_ROWS and gemm_skinny_sm90.block_scales_fit(b, b_scale)
            and splitk_sm90.scale_kind(b_scale) == splitk_sm90.SCALE_GROUP
        )  # fmt: skip
    ok_a = a_kind in (A_NONE, A_GROUP) or (a_scale.dtype == torch.float32 and (a_scale.numel() == 1 or a_kind == A_ROW))
    ok_b = b_kind == B_NONE or (b_scale.dtype == torch.float32 and (b_scale.numel() == 1 or (
        b_scale.numel() == b.shape[0] and b_scale.is_contiguous())))  # fmt: skip
    return ok_a and ok_b


def _reduce_splits(ws: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None, split: int) -> torch.Tensor:
    """c = the sum of the K splits' float32 partials (+ bias); nothing to do without splits."""
    if split > 1:
        (m, n), block = c.shape, 1024 if platform.is_gpu() else 256
        split_k_reduce_kernel[(triton.cdiv(m * n, block),)](
            ws, c, bias if bias is not None else c, m, n, c.stride(0), c.stride(1),
            SPLIT_K=split, HAS_BIAS=bias is not None, BLOCK=block, **pdl_launch(),
        )  # fmt: skip
    return c


def _scale_strides(scale: torch.Tensor | None, strided: bool) -> tuple[int, int]:
    """(row, K-group) strides of a per-row / per-column / K-grouped scale tensor; zeros for one scalar."""
    if not strided:
        return 0, 0
    return scale.stride(0), scale.stride(1) if scale.dim() > 1 else 0


def _launch_persistent(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    bias: torch.Tensor | None,
    a_scale: torch.Tensor | None,
    b_scale: torch.Tensor | None,
    a_scale_kind: int,
    b_scale_kind: int,
    group_n: int,
    int_acc: bool,
    tiles: GemmTiles,
) -> torch.Tensor:
    """gemm() through gemm_persistent_kernel: one program per SM (at most one per tile)."""
    (m, k), n = a.shape, b.shape[0]
    bm, bn, bk = tiles.block_m, tiles.block_n, tiles.block_k
    num_tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    programs = max(1, min(platform.num_multiprocessors(), num_tiles))
    dummy = c
    gemm_persistent_kernel[(programs,)](
        TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bn, bk]),
        TensorDescriptor.from_tensor(c, [bm, bn]), bias if bias is not None else dummy,
        a_scale if a_scale is not None else dummy, b_scale if b_scale is not None else dummy,
        m, n, k, *_scale_strides(a_scale, a_scale_kind >= A_ROW), *_scale_strides(b_scale, b_scale_kind != B_NONE),
        A_SCALE=a_scale_kind, B_SCALE=b_scale_kind, GROUP_N=group_n, INT_ACC=int_acc, HAS_BIAS=bias is not None,
        OUT_DTYPE=_TL_DTYPES[c.dtype], NUM_PROGRAMS=programs,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=tiles.group_m,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    return c
