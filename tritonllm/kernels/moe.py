"""The fused MoE experts in Triton (the `moe` op's `fused_moe`; kernels/reference.py defines it).

    out[t] = sum_j topk_weights[t, j] * (w2[e] @ act(w13[e] @ x[t] + b13[e]) + b2[e]),  e = topk_ids[t, j]

The T * k (token, slot) pairs are sorted by expert and padded to BLOCK_M-row blocks on the device
(kernels/moe_align.py), then two launches of one grouped-GEMM kernel run over the blocks, one
program per (block, BLOCK_N columns), each block's expert read from the alignment:

1. x @ w13[e].T: the block's x rows are gathered in the A-operand load (row = pair // k); each
   program holds two accumulators, the gate rows n and the up rows I + n of w13, so the epilogue
   applies the activation (SiLU-mul, or gpt-oss's clamped "swiglu_oai") with w13_bias and writes
   the intermediate [T * k, I] in x's dtype, row = pair.
2. intermediate @ w2[e].T: w2_bias and the pair's top-k weight in the epilogue, written per pair
   into a buffer [T * k, H] in x's dtype, which one torch sum over the k slots (float32
   accumulation) turns into out [T, H]; with k = 1 the GEMM writes out directly.

The per-slot buffer rather than float32 atomic adds into [T, H]: the result is deterministic (a
fixed summation order, no atomics, no zero-fill launch), the output is produced in x's dtype with
no float32 [T, H] buffer and cast, and the extra traffic (T * k * H values written and read once)
is small beside the GEMMs' (about a tenth at Qwen3-30B-A3B prefill shapes).

Decode-sized batches (few pairs per expert: the tile table's or default tiles say `gemv`) take
kernels/moe_gemv.py instead: one program per (pair, BLOCK_N columns), no alignment, same epilogue; on
Hopper, 16-bit and block-FP8 experts may take kernels/moe_skinny_sm90.py (TMA-fed: by default block-FP8
experts at up to 8 tokens, elsewhere opt-in TRITONLLM_MOE_SKINNY=1).

Variants (MoeTiles' flags: the tile table's, else on where the H200 measured them faster, moe_tiles.
default_variants; TRITONLLM_MOE_VARIANTS over both):
the GEMV's `joint` (gate and up rows in one pass) and `sum_slots` (w2 sums each token's slots in
registers and writes out [T, H]: no per-slot buffer, no sum); the grouped GEMM's `tma_w13` /
`tma_w2` (float and FP8 experts' tiles through a host-built tensor descriptor of [E * N, K]: TMA
bulk copies on Hopper, as the dense persistent kernel reads its operands) and `sorted_w2` (w13
writes the intermediate in the alignment's order, w2 reads each block's rows through a descriptor).

Padding rows (pair id T * k) read row 0 and are not stored; blocks past the last expert exit at
once. The grid is static (moe_align's bound): nothing syncs with the host, decode steps capture.

Quantized experts (w13 / w2 as QuantizedWeight with stacked data and scales, MOE_FORMATS):
- "fp8:block:group": e4m3 data [E, N, K], float32 scales [E, cdiv(N, 128), cdiv(K, 128)];
  activations quantized per token and 1 x 128 group (kernels/quant.py) before each GEMM, each
  K tile's partial product multiplied by its group's activation and weight scales (BLOCK_K <= 128).
- "mxfp4:mx:none": e2m1 pairs [E, N, K / 2] with e8m0 scales [E, N, K / 32], decoded to the
  activations' dtype in registers by the GEMM family's helpers (kernels/gemm_scales.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from tritonllm import platform
from tritonllm.kernels import moe_gemv_sm90, moe_skinny_sm90
from tritonllm.kernels.gemm import GemmTiles
from tritonllm.kernels.gemm_persistent import descriptors_fit, tile_coords
from tritonllm.kernels.gemm_scales import DEC_FP4, dequant_values, group_scales, unpack_values
from tritonllm.kernels.gemv_w4 import FP4_BITS, FP4_HALF2, as_words, half2_bound_exp, w4_gemv_fits
from tritonllm.kernels.launch import pdl_launch, pdl_wait
from tritonllm.kernels.moe_align import MoeAlignment, moe_align
from tritonllm.kernels.moe_epilogue import activation_bound, moe_store
from tritonllm.kernels.moe_gemv import moe_gemv_kernel
from tritonllm.kernels.moe_tiles import MoeTiles, gemv_early, gemv_loads, gemv_reduce, moe_kind, pick_moe_tiles
from tritonllm.kernels.quant import quantize_per_group
from tritonllm.kernels.quant_formats import BLOCK, MX_GROUP, QuantizedWeight
from tritonllm.kernels.reference import MOE_ACTIVATIONS
from tritonllm.kernels.registry import FLOATS, Supports, register

try:  # host-built tensor descriptors (TMA on Hopper), as gemm.py's persistent kernel takes them
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton
    TensorDescriptor = None

Q_NONE, Q_FP8_BLOCK, Q_MXFP4 = 0, 1, 2
MOE_FORMATS = {"fp8:block:group": Q_FP8_BLOCK, "mxfp4:mx:none": Q_MXFP4}
# the quantized expert formats served, declared as features of the moe op: the engine requires those
# of the model's experts (models/loader.py layer_features), so a model with others takes the reference
MOE_SUPPORTS = Supports(dtypes=FLOATS, features=frozenset(MOE_FORMATS))


@triton.jit
def _load_b(b_ptrs, scale_ptr, rn, k, K, offs_kb, stride_sn, stride_sk,
            QUANT: tl.constexpr, EVEN_K: tl.constexpr, GROUP_K: tl.constexpr,
            BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """The expert's [BLOCK_K, BLOCK_N] weight tile at K offset k, columns rn: as stored, or MXFP4
    decoded to float32 (the caller casts it to the activations' dtype)."""
    PACK: tl.constexpr = 2 if QUANT == 2 else 1
    if EVEN_K:
        b = tl.load(b_ptrs)
    else:
        b = tl.load(b_ptrs, mask=(k // PACK + offs_kb < K // PACK)[:, None], other=0.0)
    if QUANT == 2:
        b = unpack_values(b, DEC_FP4, BLOCK_K, BLOCK_N, 1)
        b = dequant_values(b, scale_ptr, scale_ptr, rn, k, K, stride_sn, stride_sk,
                           DEC_FP4, GROUP_K, BLOCK_K, BLOCK_N, 1, 1)  # fmt: skip
    return b


@triton.jit
def _dot(acc, a, b, IEEE: tl.constexpr):
    if IEEE:  # float32 operands: full precision, not TF32
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def fused_moe_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, topk_weights_ptr, sorted_ids_ptr, block_expert_ptr,
    num_pairs, num_blocks, N, K, num_experts, alpha, limit, a_desc, b_desc, rows_per_expert,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn, stride_bias_e,
    stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
    A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
    MUL_WEIGHTS: tl.constexpr, QUANT: tl.constexpr, GROUP_K: tl.constexpr, IEEE: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    TMA_B: tl.constexpr = False, SORTED_A: tl.constexpr = False, TMA_A: tl.constexpr = False,
    SORTED_C: tl.constexpr = False, ONE_B_GROUP: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    """c[pair, n] for the pairs of one aligned block and BLOCK_N columns (module docstring): A rows
    pair // A_ROW_DIV, B the block's expert's [N (x2 when GATED), K] matrix. TMA_B (float and FP8
    experts): B's tiles through b_desc, a tensor descriptor of the stacked experts as one
    [E * rows_per_expert, K] matrix with [BLOCK_N, BLOCK_K] boxes (Hopper: TMA bulk copies instead
    of per-thread loads; rows past a tile's own read other rows or zeros, and are not stored).
    SORTED_C (w13): c's rows in the alignment's order (row = the pair's position: the block's rows
    contiguous), padding rows included (computed from A row 0: finite, never read back as results).
    SORTED_A (w2, on such an intermediate): A's rows are the block's own, read through a_desc with
    TMA_A ([BLOCK_M, BLOCK_K] boxes), else by pointers. ONE_B_GROUP (FP8 block): the tile's columns, and
    GATED's up rows, lie in one 128-row scale block (BLOCK_N divides it, so does N when GATED), so B's
    scale is one uniform load a K step instead of one a column (sm90: 32 of the w13 loop's 34 loads)."""
    pdl_wait(PDL)
    pid_m, pid_n = tile_coords(tl.program_id(0), num_blocks, tl.cdiv(N, BLOCK_N), GROUP_M)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert >= num_experts:  # past the last expert's padded segment
        return
    pair = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < num_pairs
    pair = tl.where(valid, pair, 0)
    position = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # the rows' places in the alignment's order
    if SORTED_A:
        rm = position.to(tl.int64)
    else:
        rm = (pair // A_ROW_DIV).to(tl.int64)  # padding rows read row 0; their results are not stored
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < N, offs_n, 0)
    e = expert.to(tl.int64)
    b_ptr += e * stride_be
    b_scale_ptr += e * stride_bse
    PACK: tl.constexpr = 2 if QUANT == 2 else 1  # K values per byte of B
    offs_k = tl.arange(0, BLOCK_K)
    offs_kb = tl.arange(0, BLOCK_K // PACK)
    a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + rn[None, :].to(tl.int64) * stride_bn + offs_kb[:, None] * stride_bk
    up_ptrs = b_ptrs + N * stride_bn  # GATED: w13's up rows, I below the gate rows
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    desc_row = (e * rows_per_expert + pid_n * BLOCK_N).to(tl.int32)  # TMA_B: the tile's first row
    for k in range(0, K, BLOCK_K):
        if TMA_A:  # SORTED_A through a descriptor; columns past K read zeros
            a = a_desc.load([pid_m * BLOCK_M, k])
        elif EVEN_K:
            a = tl.load(a_ptrs)
        else:
            a = tl.load(a_ptrs, mask=(k + offs_k < K)[None, :], other=0.0)
        if TMA_B:  # columns past K read zeros
            b = b_desc.load([desc_row, k]).T
            if GATED:
                b_up = b_desc.load([desc_row + N, k]).T
        else:
            b = _load_b(b_ptrs, b_scale_ptr, rn, k, K, offs_kb, stride_bsn, stride_bsk,
                        QUANT, EVEN_K, GROUP_K, BLOCK_K, BLOCK_N).to(a.dtype)  # fmt: skip
            if GATED:
                b_up = _load_b(up_ptrs, b_scale_ptr, rn + N, k, K, offs_kb, stride_bsn, stride_bsk,
                               QUANT, EVEN_K, GROUP_K, BLOCK_K, BLOCK_N).to(a.dtype)  # fmt: skip
        if QUANT == 1 and ONE_B_GROUP:  # FP8 blocks, the tile in one B scale block: a row scale, one B scale
            a_s, _ = group_scales(a_scale_ptr, b_scale_ptr, rm, rn, k // GROUP_K, stride_asm, stride_ask,
                                  stride_bsn, stride_bsk, 3, 0, GROUP_K, False)  # fmt: skip
            b_s_ptr = b_scale_ptr + (pid_n * BLOCK_N // GROUP_K) * stride_bsn + (k // GROUP_K) * stride_bsk
            acc += tl.dot(a, b) * (a_s * tl.load(b_s_ptr))[:, None]
            if GATED:
                acc_up += tl.dot(a, b_up) * (a_s * tl.load(b_s_ptr + (N // GROUP_K) * stride_bsn))[:, None]
        elif QUANT == 1:  # FP8 blocks: the tile's partial products times its K group's scales
            a_s, b_s = group_scales(a_scale_ptr, b_scale_ptr, rm, rn, k // GROUP_K, stride_asm, stride_ask,
                                    stride_bsn, stride_bsk, 3, 3, GROUP_K, False)  # fmt: skip
            acc += tl.dot(a, b) * (a_s[:, None] * b_s[None, :])
            if GATED:
                _, b_s_up = group_scales(a_scale_ptr, b_scale_ptr, rm, rn + N, k // GROUP_K, stride_asm,
                                         stride_ask, stride_bsn, stride_bsk, 0, 3, GROUP_K, False)  # fmt: skip
                acc_up += tl.dot(a, b_up) * (a_s[:, None] * b_s_up[None, :])
        else:
            acc = _dot(acc, a, b, IEEE)
            if GATED:
                acc_up = _dot(acc_up, a, b_up, IEEE)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += (BLOCK_K // PACK) * stride_bk
        up_ptrs += (BLOCK_K // PACK) * stride_bk

    if SORTED_C:  # every row of the block, at its place
        pair = position
        valid = position >= 0
    moe_store(acc, acc_up, c_ptr, bias_ptr, topk_weights_ptr, pair, valid, e, rn, offs_n, N, alpha, limit,
              stride_cm, stride_cn, stride_bias_e, GATED, ACTIVATION, HAS_BIAS, MUL_WEIGHTS)  # fmt: skip


def _launch(
    a: torch.Tensor,
    a_scale: torch.Tensor | None,
    w: torch.Tensor | QuantizedWeight,
    c: torch.Tensor,
    bias: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    route: MoeAlignment | torch.Tensor,
    tiles: GemmTiles,
    *,
    n: int,
    k: int,
    a_row_div: int,
    gated: bool,
    activation: int = 0,
    alpha: float = 0.0,
    limit: float = 0.0,
    joint: bool = False,
    slots: int = 0,
    tma: bool = False,
    sorted_a: bool = False,
    sorted_c: bool = False,
    early: bool = False,
    a_bound: float = 0.0,
    gluon: bool = False,
) -> None:
    """One launch over the pairs: c[pair, :n] for B = w[expert] ([E, n, k]; w13: [E, 2n, k]). `route`:
    the alignment for the grouped GEMM, or (tiles.gemv) the topk_ids [T, top_k] for the GEMV
    (kernels/moe_gemv.py: `joint` gate and up rows, or `slots` > 0: c[token] the sum of its slots).
    `tma`: the grouped GEMM reads B through a tensor descriptor, where one describes it (_b_descriptor).
    `sorted_c`: c's rows in the alignment's order ([num_blocks * BLOCK_M, n]); `sorted_a`: a is such a
    matrix, read through a descriptor where one describes it. `early`: a launch whose route no launch
    since the one before it has written (w2's), so that the GEMV may read its ids and first weights
    before its PDL wait (moe_tiles.gemv_early: MXFP4 words with summed slots). `a_bound`: a bound
    on |a| known from its producer (0: none), which spares the GEMV's half-pair decode its pass over the rows.
    `gluon`: the GEMV launch runs the Hopper Gluon kernel for MXFP4 words (moe_gemv_sm90; fused_moe's _gluon_w4)."""
    quant = Q_NONE if not isinstance(w, QuantizedWeight) else MOE_FORMATS[w.scheme.format_name]
    data = w.data if isinstance(w, QuantizedWeight) else w
    b_scale = w.scale if isinstance(w, QuantizedWeight) else None
    dummy = c  # stands in for absent pointers (never read)
    a_s_strides = (a_scale.stride(0), a_scale.stride(1)) if a_scale is not None else (0, 0)
    b_s_strides = b_scale.stride() if b_scale is not None else (0, 0, 0)
    group_k = {Q_NONE: 1, Q_FP8_BLOCK: BLOCK, Q_MXFP4: MX_GROUP}[quant]
    pointers = (
        a,
        data,
        c,
        bias if bias is not None else dummy,
        a_scale if a_scale is not None else dummy,
        b_scale if b_scale is not None else dummy,
        topk_weights if topk_weights is not None else dummy,
    )
    strides = (
        a.stride(0),
        a.stride(1),
        data.stride(0),
        data.stride(1),
        data.stride(2),
        c.stride(0),
        c.stride(1),
        bias.stride(0) if bias is not None else 0,
        *a_s_strides,
        *b_s_strides,
    )
    flags = dict(
        A_ROW_DIV=a_row_div,
        GATED=gated,
        ACTIVATION=activation,
        HAS_BIAS=bias is not None,
        MUL_WEIGHTS=topk_weights is not None,
        QUANT=quant,
        GROUP_K=group_k,
        EVEN_K=k % tiles.block_k == 0,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    if tiles.gemv:
        t, top_k = route.shape
        words = _words(data, k, tiles.block_k) if quant == Q_MXFP4 else None
        if gluon:  # opt-in: the Hopper Gluon GEMV (fused_moe's _gluon_w4); slots: w2 sums them itself
            moe_gemv_sm90.moe_w4_gemv_sm90(a, words, c, bias, b_scale, topk_weights, route, n=n, k=k,
                                           a_row_div=a_row_div, gated=gated, activation=activation, alpha=alpha,
                                           limit=limit, pdl=pdl_launch(), sum_slots=bool(slots),
                                           early=early and gemv_early())  # fmt: skip
            return
        if words is not None:  # MXFP4 read as words of eight nibbles (kernels/gemv_w4.py)
            pointers = (pointers[0], words, *pointers[2:])
            strides = (*strides[:2], *words.stride(), *strides[5:])
        b = words if words is not None else data
        rows_per_expert = b.stride(0) // b.stride(1)  # SLOTS: the experts' rows read as one matrix (_flat_experts)
        if slots:
            flags["BLOCK_N"] = max(1, tiles.block_n // slots)  # the tile's rows shared by the slots
        grid = (triton.cdiv(n, flags["BLOCK_N"]), t if slots else t * top_k)
        loads = gemv_loads(words is not None)
        early = early and bool(slots) and words is not None and loads != 0 and gemv_early()  # (pays with PDL only)
        a_exp = half2_bound_exp(a_bound) if words is not None and FP4_BITS >= FP4_HALF2 else 0
        moe_gemv_kernel[grid](*pointers, route, n, k, alpha, limit, top_k, rows_per_expert, *strides, **flags,
                              WORDS=words is not None, FP4_BITS=FP4_BITS, JOINT=joint, SLOTS=slots, REDUCE=gemv_reduce(),
                              LOADS=loads, EARLY=early, A_EXP=a_exp, **pdl_launch())  # fmt: skip
        return
    grid = (route.num_blocks * triton.cdiv(n, tiles.block_n),)
    b_desc = _b_descriptor(data, tiles) if tma and quant != Q_MXFP4 else None
    a_desc = TensorDescriptor.from_tensor(a, [tiles.block_m, tiles.block_k]) if sorted_a and _fits(a) else None
    fused_moe_kernel[grid](
        *pointers, route.sorted_ids, route.block_expert, route.num_pairs, route.num_blocks, n, k, data.shape[0],
        alpha, limit, a_desc, b_desc, data.shape[1], *strides, IEEE=a.dtype == torch.float32, BLOCK_M=tiles.block_m,
        GROUP_M=tiles.group_m, **flags, TMA_B=b_desc is not None, SORTED_A=sorted_a, TMA_A=a_desc is not None,
        SORTED_C=sorted_c, ONE_B_GROUP=one_b_group(quant, tiles.block_n, n, group_k, gated), **pdl_launch(),
    )  # fmt: skip


def _gluon_w4(x: torch.Tensor, w13: QuantizedWeight, w2: QuantizedWeight, tiles: MoeTiles, h: int, i: int) -> bool:
    """Whether both GEMV launches of MXFP4 experts take the Hopper Gluon kernel (moe_gemv_sm90, opt-in): the GEMV's
    tiles, both inner sizes (H, I) served, both experts read as int32 words that it loads as they lie."""
    if not (tiles.gemv and moe_gemv_sm90.takes(x, h) and moe_gemv_sm90.takes(x, i)):
        return False
    words = (_words(w13.data, h, tiles.w13.block_k), _words(w2.data, i, tiles.w2.block_k))
    return all(wd is not None and moe_gemv_sm90.fits(wd, x) for wd in words)


def one_b_group(quant: int, block_n: int, n: int, group: int, gated: bool) -> bool:
    """Whether each grouped-GEMM tile's columns (and, gated, its up rows, N below) lie in one of FP8 block's
    128-row scale blocks (fused_moe_kernel's ONE_B_GROUP). TRITONLLM_MOE_FP8_B_SCALE=column keeps a scale
    load a column everywhere (the A/B of `gpu_check.sh moe-loads`)."""
    if os.environ.get("TRITONLLM_MOE_FP8_B_SCALE") == "column":
        return False
    return quant == Q_FP8_BLOCK and group % block_n == 0 and (not gated or n % group == 0)


def _fits(t: torch.Tensor) -> bool:
    """Whether a tensor descriptor can describe this 2-D tensor (and this Triton has descriptors)."""
    return TensorDescriptor is not None and descriptors_fit(t)


def _b_descriptor(data: torch.Tensor, tiles: GemmTiles):
    """A tensor descriptor of stacked experts [E, N, K] as one [E * N, K] matrix with [BLOCK_N, BLOCK_K]
    boxes, or None where a descriptor cannot describe them (rows not 16-byte multiples, not stacked
    contiguously, this Triton without descriptors)."""
    if not _stacked(data):
        return None
    flat = data.view(-1, data.shape[2])
    return TensorDescriptor.from_tensor(flat, [tiles.block_n, tiles.block_k]) if _fits(flat) else None


def _stacked(t: torch.Tensor) -> bool:
    """Whether [E, N, ...] experts lie N rows apart, so that they read as one [E * N, ...] matrix."""
    return t.stride(0) == t.shape[1] * t.stride(1)


def _words(data: torch.Tensor, k: int, block_k: int) -> torch.Tensor | None:
    """MXFP4 experts as int32 words for the GEMV, where the shape and the storage allow."""
    return as_words(data) if w4_gemv_fits(k, MX_GROUP, block_k) else None


def _flat_experts(w: torch.Tensor | QuantizedWeight, block_k: int) -> bool:
    """Whether the GEMV can read the stacked experts [E, N, K] as one [E * N, K] matrix (SLOTS: each
    slot's rows e * N + n), scales included: experts N rows apart, MXFP4 as words, FP8 block scales
    whole (N a multiple of 128)."""
    if not isinstance(w, QuantizedWeight):
        return _stacked(w)
    data, scale = w.data, w.scale
    n = data.shape[1]
    if w.scheme.format_name == "mxfp4:mx:none":  # scales a row each: [E, N, K / 32]
        data = _words(data, 2 * data.shape[2], block_k)
        scale_rows = n
    else:  # FP8 block: a row of scales each 128 rows, [E, N / 128, K / 128]
        scale_rows = n // BLOCK if n % BLOCK == 0 else None
    return (
        data is not None
        and scale_rows is not None
        and _stacked(data)
        and scale.stride(0) == scale_rows * scale.stride(1)
    )


def _expert_shape(w: torch.Tensor | QuantizedWeight) -> tuple[int, int, int]:
    """(E, N, K) of stacked expert weights (packed MXFP4: two K values a byte)."""
    if not isinstance(w, QuantizedWeight):
        return tuple(w.shape)
    if w.scheme.format_name not in MOE_FORMATS:
        raise ValueError(f"triton fused_moe: experts in {w.scheme.format_name} are not among {sorted(MOE_FORMATS)}")
    e, n, k = w.data.shape
    return e, n, 2 * k if w.scheme.packed else k


def moe_tiles_for(
    x: torch.Tensor, w13: torch.Tensor | QuantizedWeight, w2: torch.Tensor | QuantizedWeight, top_k: int
) -> MoeTiles:
    """The tiles fused_moe takes for these operands (the table's for this GPU, else the default)."""
    (e, _, h), i = _expert_shape(w13), _expert_shape(w2)[2]
    fmt = w13.scheme.format_name if isinstance(w13, QuantizedWeight) else None
    a_bytes = 1 if fmt == "fp8:block:group" else x.element_size()
    b_bytes = 1 if fmt is not None else x.element_size()
    return pick_moe_tiles(moe_kind(x.dtype, fmt), e, h, i, x.shape[0], top_k, a_bytes, b_bytes)


@register("moe", "triton", supports=MOE_SUPPORTS, priority=10)
def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor | QuantizedWeight,
    w2: torch.Tensor | QuantizedWeight,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    alpha: float = 1.702,
    limit: float = 7.0,
    out: torch.Tensor | None = None,
    tiles: MoeTiles | None = None,
    after_w13: Callable[[], None] | None = None,
) -> torch.Tensor:
    """x [T, H], w13 [E, 2I, H], w2 [E, H, I] (tensors in x's dtype, or
    QuantizedWeight in MOE_FORMATS), topk_* [T, k] -> [T, H] in x's dtype (into `out` when given).
    `tiles` overrides the table (tests, tile sweeps). after_w13: called once w13's launch is queued (a
    decode step's next weight prefetch, layers/prefetch.py: it streams in while w2 runs)."""
    if activation not in MOE_ACTIVATIONS:
        raise ValueError(f"MoE activation {activation!r} is not one of {MOE_ACTIVATIONS}")
    (e, two_i, h), (e2, h2, i) = _expert_shape(w13), _expert_shape(w2)
    if x.dim() != 2 or x.shape[1] != h or (e2, h2, two_i) != (e, h, 2 * i) or topk_ids.shape != topk_weights.shape:
        raise ValueError(f"fused_moe: x {tuple(x.shape)}, w13 [E, 2I, H] {(e, two_i, h)}, w2 [E, H, I] {(e2, h2, i)}, "
                         f"topk {tuple(topk_ids.shape)} / {tuple(topk_weights.shape)} do not agree")  # fmt: skip
    t, top_k = topk_ids.shape
    out = torch.empty_like(x) if out is None else out
    if t == 0:
        return out
    x = x if x.stride(-1) == 1 else x.contiguous()
    fmt = w13.scheme.format_name if isinstance(w13, QuantizedWeight) else None
    fp8 = fmt == "fp8:block:group"
    if fp8 and not platform.has_fp8():  # Triton cannot compile FP8 dots for it (e.g. sm80)
        raise ValueError("triton fused_moe: FP8 block experts need FP8 support (NVIDIA sm89+, AMD MI300)")
    tiles = moe_tiles_for(x, w13, w2, top_k) if tiles is None else tiles
    weights = topk_weights.reshape(-1)
    weights = weights if weights.dtype == torch.float32 else weights.float()
    if tiles.gemv and moe_skinny_sm90.takes(x, w13, w2, top_k, activation):  # Hopper: moe_skinny_sm90.AUTO
        return moe_skinny_sm90.fused_moe_skinny(
            x, w13, w2, weights, topk_ids, out, activation=activation, w13_bias=w13_bias, w2_bias=w2_bias,
            alpha=alpha, limit=limit, after_w13=after_w13,
        )  # fmt: skip
    # the grouped GEMM's alignment of the pairs to row blocks; the GEMV reads each pair's expert itself
    route = topk_ids.contiguous() if tiles.gemv else moe_align(topk_ids, e, tiles.block_m)
    # the GEMV's w2 summing each token's slots (no per-slot buffer) where the experts read as one matrix
    slots = (
        triton.next_power_of_2(top_k) if tiles.sum_slots and top_k > 1 and _flat_experts(w2, tiles.w2.block_k) else 0
    )
    gluon = fmt == "mxfp4:mx:none" and _gluon_w4(x, w13, w2, tiles, h, i)
    if gluon:  # the Gluon GEMV's w2 sums the slots itself where the arrival counters serve, else per-slot rows
        slots = top_k if moe_gemv_sm90.sums_slots(t, top_k, h, x.device) else 0

    a, a_scale = quantize_per_group(x, w13.data.dtype, BLOCK) if fp8 else (x, None)
    # sorted_w2: the intermediate in the alignment's order, so that w2 reads each block's rows whole
    in_order = tiles.sorted_w2 and not tiles.gemv
    rows = route.num_blocks * tiles.block_m if in_order else t * top_k
    intermediate = torch.empty((rows, i), dtype=x.dtype, device=x.device)
    _launch(a, a_scale, w13, intermediate, w13_bias, None, route, tiles.w13, n=i, k=h, a_row_div=top_k,
            gated=True, activation=MOE_ACTIVATIONS.index(activation), alpha=alpha, limit=limit,
            joint=tiles.joint, tma=tiles.tma_w13, sorted_c=in_order, gluon=gluon)  # fmt: skip
    if after_w13 is not None:
        after_w13()

    a, a_scale = quantize_per_group(intermediate, w2.data.dtype, BLOCK) if fp8 else (intermediate, None)
    per_slot = out if top_k == 1 or slots else torch.empty((t * top_k, h), dtype=x.dtype, device=x.device)
    _launch(a, a_scale, w2, per_slot, w2_bias, weights, route, tiles.w2, n=h, k=i, a_row_div=1, gated=False,
            slots=slots, tma=tiles.tma_w2, sorted_a=in_order, early=True,
            a_bound=activation_bound(activation, alpha, limit), gluon=gluon)  # fmt: skip
    if top_k > 1 and not slots:
        torch.sum(per_slot.view(t, top_k, h), dim=1, out=out)
    return out
