"""The fused MoE's GEMV kernel, for decode-sized batches (a few (token, expert) pairs per expert).

At decode the experts' weight read is the whole cost, and the grouped GEMM (kernels/moe.py) spends
launches on the alignment (the pairs sorted and padded per expert), pads every expert's rows to a
16-row tensor-core tile and stages the weight through shared memory. Here each program takes one
pair (token t, slot j, expert e = topk_ids[t, j]) and BLOCK_N output columns: the expert's weight
rows are loaded straight into registers (K contiguous, wide loads), widened to float32, multiplied
by the pair's activation row and summed along K, as in the dense GEMV (kernels/gemm_gemv.py, whose
MXFP4 decoding it shares). No alignment at all: the expert comes from topk_ids, so a decode step is
router + two GEMV launches + the sum over slots. Pairs that share an expert read its weight once
each (from L2 when close in time), so the path pays while pairs per expert stay near one; the tile
table (or the default by rows per expert, kernels/moe_tiles.py) decides, `GemmTiles.gemv`.

The epilogue is the grouped GEMM's (kernels/moe_epilogue.py): bias, gated activation (w13 holds the
gate rows and, I below, the up rows: two accumulators), top-k weight, store per pair. Formats:
float weights; FP8 block-128 (e4m3 weights and per-token-group e4m3 activations, each K tile within
one 128 group, times its activation and weight scales); MXFP4 (e2m1 pairs, e8m0 scale per 32).

When a step's loads are issued is a constexpr too (LOADS; moe_tiles.gemv_loads picks it): the scales late
(0, the default: MXFP4's after the activation's layout change, kernels/gemv_w4.py; FP8 block's after the
products), every load at the top of its step (1), or a step ahead in registers (2). How the float paths sum along K is a constexpr (REDUCE, _row_dot;
moe_tiles.gemv_reduce picks it):
every step across the program's threads (0: a barrier a step), per column once after the loop (1:
the whole float tile in registers), or every step within each thread's eight columns and across
threads once after the loop (2, the default: no barrier in the loop, the fewest registers).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tritonllm.kernels.gemm_scales import DEC_FP4, gemv_decoded_part
from tritonllm.kernels.gemv_w4 import w4_row_dot, w4_step_weights
from tritonllm.kernels.launch import pdl_wait
from tritonllm.kernels.moe_epilogue import moe_store


@triton.jit
def _float_part(b, a, a_s, b_s, a_scale_ptr, b_scale_ptr, rows, rn, k, stride_asm, stride_ask, stride_bsn, stride_bsk,
                QUANT: tl.constexpr, GROUP_K: tl.constexpr, SLOTS: tl.constexpr, REDUCE: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LOADED: tl.constexpr):  # fmt: skip
    """One K step of the float / FP8-block GEMV: b the weight tile, a the activation (float32, shaped as
    _row_dot loads it), summed by REDUCE; FP8 block: times the step's activation and weight scales
    (LOADED: a_s and b_s, else loaded here, after the products: LOADS 0's order)."""
    CHUNK: tl.constexpr = min(8, BLOCK_K)
    if REDUCE == 0 and not SLOTS:
        a = a[None, :]
    prod = b.to(tl.float32) * a
    if REDUCE == 0:
        part = tl.sum(prod, axis=len(prod.shape) - 1)
    elif REDUCE == 1:
        part = prod
    elif SLOTS:
        part = tl.sum(tl.reshape(prod, [SLOTS, BLOCK_N, BLOCK_K // CHUNK, CHUNK]), axis=3)
    else:
        part = tl.sum(tl.reshape(prod, [BLOCK_N, BLOCK_K // CHUNK, CHUNK]), axis=2)
    if QUANT == 1:  # FP8 block: the tile lies in one K group (SLOTS: N a multiple of it, so rn // GROUP_K
        # is the flat row of the expert's scales); scaled once the step's columns are summed
        if not LOADED:
            a_s = tl.load(a_scale_ptr + rows * stride_asm + (k // GROUP_K) * stride_ask)
            b_s = tl.load(b_scale_ptr + (rn // GROUP_K) * stride_bsn + (k // GROUP_K) * stride_bsk)
        scale = a_s[:, None] * b_s if SLOTS else a_s * b_s  # [SLOTS, BLOCK_N] / [BLOCK_N]
        if REDUCE != 0:  # part keeps a column axis
            scale = tl.expand_dims(scale, len(scale.shape))
        part = part * scale
    return part


@triton.jit
def _float_loads(a_ptrs, b_ptrs, a_scale_ptr, b_scale_ptr, rows, rn, k, K, stride_ak, stride_bk, stride_asm,
                 stride_ask, stride_bsn, stride_bsk, QUANT: tl.constexpr, GROUP_K: tl.constexpr, EVEN_K: tl.constexpr,
                 BLOCK_K: tl.constexpr):  # fmt: skip
    """Step k's loads of the float / FP8-block GEMV (LOADS 1 / 2): the weight tile, the activation as
    float32 (a_ptrs / b_ptrs: step 0's, any shape), and FP8 block's two scales (else zeros); masked
    past K unless EVEN_K, the scales' step clamped into K."""
    offs_k = tl.arange(0, BLOCK_K)
    if EVEN_K:
        b = tl.load(b_ptrs + k * stride_bk)
        a = tl.load(a_ptrs + k * stride_ak).to(tl.float32)
    else:
        b = tl.load(b_ptrs + k * stride_bk, mask=k + offs_k < K, other=0.0)
        a = tl.load(a_ptrs + k * stride_ak, mask=k + offs_k < K, other=0.0).to(tl.float32)
    a_s = 0.0
    b_s = 0.0
    if QUANT == 1:
        g = tl.minimum(k, K - 1) // GROUP_K
        a_s = tl.load(a_scale_ptr + rows * stride_asm + g * stride_ask)
        b_s = tl.load(b_scale_ptr + (rn // GROUP_K) * stride_bsn + g * stride_bsk)
    return b, a, a_s, b_s


@triton.jit
def _row_dot(a_ptr, rows, a_scale_ptr, b_ptr, b_scale_ptr, rn, K, stride_am, stride_ak, stride_asm, stride_ask,
             stride_bn, stride_bk, stride_bsn, stride_bsk, QUANT: tl.constexpr, GROUP_K: tl.constexpr,
             EVEN_K: tl.constexpr, WORDS: tl.constexpr, FP4_BITS: tl.constexpr, SLOTS: tl.constexpr,
             REDUCE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LOADS: tl.constexpr = 0,
             FIRST: tl.constexpr = False, words0=0, s0=0, A_EXP: tl.constexpr = 0):  # fmt: skip
    """sum over K of w[rn, k] * a[row, k] in float32: one activation row (`rows` a scalar) against the
    weight rows rn [BLOCK_N]; or (SLOTS) a token's slots, `rows` [SLOTS] activation rows each against
    its own weight rows rn [SLOTS, BLOCK_N] of the experts' stacked weights read as one [E * N, K]
    matrix (row e * N + n). MXFP4 read as int32 words (WORDS: kernels/gemv_w4.py; b_ptr then points
    at words, stride_bn in words); FIRST (MXFP4 words, LOADS 1 / 2): the first K step's words and
    scales are words0 / s0, loaded by the caller. A_EXP (MXFP4 words in half pairs): a bound on the
    activations' magnitude (gemv_w4.w4_row_dot)."""
    if QUANT == 2 and WORDS:
        acc = w4_row_dot(a_ptr, rows, None, b_ptr, b_scale_ptr, b_scale_ptr, rn, 0, K, stride_am, stride_ak, stride_bn,
                         stride_bsn, stride_bsk, True, FP4_BITS, GROUP_K, EVEN_K, SLOTS if SLOTS else 1, BLOCK_N,
                         BLOCK_K // 8, LOADS, FIRST, words0, s0, A_EXP)  # fmt: skip
    else:
        tl.static_assert(not FIRST, "_row_dot FIRST: MXFP4 words only")
        PACK: tl.constexpr = 2 if QUANT == 2 else 1  # K values per byte of B
        offs_k = tl.arange(0, BLOCK_K)
        offs_kb = tl.arange(0, BLOCK_K // PACK)
        # float weights, by REDUCE (moe_tiles.gemv_reduce): the K tile's products summed every step across
        # the program's threads (0: a cross-warp reduction through shared memory, barriers included, every
        # iteration; one float a row held), accumulated per K column and summed once after the loop (1: no
        # barriers, the whole [BLOCK_N, BLOCK_K] tile of floats held), or summed every step over each
        # thread's own eight consecutive columns only (2: no barriers, an eighth of the tile held)
        CHUNK: tl.constexpr = min(8, BLOCK_K)
        if SLOTS:
            a_ptrs = a_ptr + rows[:, None, None] * stride_am + (rn * 0)[:, :, None] + offs_k[None, None, :] * stride_ak
            b_ptrs = b_ptr + rn[:, :, None] * stride_bn + offs_kb[None, None, :] * stride_bk  # [SLOTS, BLOCK_N, .]
            if REDUCE == 0:
                acc = tl.zeros((SLOTS, BLOCK_N), dtype=tl.float32)
            elif REDUCE == 1:
                acc = tl.zeros((SLOTS, BLOCK_N, BLOCK_K), dtype=tl.float32)
            else:
                acc = tl.zeros((SLOTS, BLOCK_N, BLOCK_K // CHUNK), dtype=tl.float32)
        else:
            if REDUCE == 0:  # one row [BLOCK_K], broadcast after the load
                a_ptrs = a_ptr + rows * stride_am + offs_k * stride_ak
            else:  # [BLOCK_N, BLOCK_K]: the weight tile's layout
                a_ptrs = a_ptr + rows * stride_am + (rn * 0)[:, None] + offs_k[None, :] * stride_ak
            b_ptrs = b_ptr + rn[:, None] * stride_bn + offs_kb[None, :] * stride_bk
            if QUANT == 2 or REDUCE == 0:
                acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
            elif REDUCE == 1:
                acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
            else:
                acc = tl.zeros((BLOCK_N, BLOCK_K // CHUNK), dtype=tl.float32)
        if QUANT != 2 and LOADS != 0:  # float / FP8 block with the step's loads at its top, or a step ahead
            if LOADS == 2:
                b, a, a_s, b_s = _float_loads(a_ptrs, b_ptrs, a_scale_ptr, b_scale_ptr, rows, rn, 0, K, stride_ak,
                                              stride_bk, stride_asm, stride_ask, stride_bsn, stride_bsk, QUANT, GROUP_K,
                                              EVEN_K, BLOCK_K)  # fmt: skip
            for k in range(0, K, BLOCK_K):
                if LOADS == 2:
                    k_next = k + BLOCK_K
                    if EVEN_K:  # in bounds: past the end, this step again (a multiple of BLOCK_K still)
                        k_next = k + BLOCK_K * (k_next < K).to(tl.int32)
                    n_b, n_a, n_as, n_bs = _float_loads(a_ptrs, b_ptrs, a_scale_ptr, b_scale_ptr, rows, rn, k_next, K,
                                                        stride_ak, stride_bk, stride_asm, stride_ask, stride_bsn,
                                                        stride_bsk, QUANT, GROUP_K, EVEN_K, BLOCK_K)  # fmt: skip
                else:
                    b, a, a_s, b_s = _float_loads(a_ptrs, b_ptrs, a_scale_ptr, b_scale_ptr, rows, rn, k, K, stride_ak,
                                                  stride_bk, stride_asm, stride_ask, stride_bsn, stride_bsk, QUANT,
                                                  GROUP_K, EVEN_K, BLOCK_K)  # fmt: skip
                acc += _float_part(b, a, a_s, b_s, a_scale_ptr, b_scale_ptr, rows, rn, k, stride_asm, stride_ask,
                                   stride_bsn, stride_bsk, QUANT, GROUP_K, SLOTS, REDUCE, BLOCK_N, BLOCK_K, True)  # fmt: skip
                if LOADS == 2:
                    b, a, a_s, b_s = n_b, n_a, n_as, n_bs
        else:
            for k in range(0, K, BLOCK_K):
                if EVEN_K:
                    b = tl.load(b_ptrs)
                else:
                    b = tl.load(b_ptrs, mask=k // PACK + offs_kb < K // PACK, other=0.0)
                if QUANT == 2:  # bytes (not SLOTS: the launcher gives SLOTS the words)
                    acc += gemv_decoded_part(b, a_ptr + rows * stride_am, b_scale_ptr, b_scale_ptr, rn, k, K,
                                             stride_ak, stride_bsn, stride_bsk, DEC_FP4, GROUP_K, BLOCK_K, BLOCK_N)  # fmt: skip
                else:
                    if EVEN_K:
                        a = tl.load(a_ptrs).to(tl.float32)
                    else:
                        a = tl.load(a_ptrs, mask=k + offs_k < K, other=0.0).to(tl.float32)
                    acc += _float_part(b, a, 0.0, 0.0, a_scale_ptr, b_scale_ptr, rows, rn, k, stride_asm, stride_ask,
                                       stride_bsn, stride_bsk, QUANT, GROUP_K, SLOTS, REDUCE, BLOCK_N, BLOCK_K, False)  # fmt: skip
                a_ptrs += BLOCK_K * stride_ak
                b_ptrs += (BLOCK_K // PACK) * stride_bk
        if QUANT != 2 and REDUCE != 0:
            acc = tl.sum(acc, axis=len(acc.shape) - 1)
    return acc


@triton.jit
def _slot_experts(topk_ids_ptr, top_k, SLOTS: tl.constexpr, PAST_L1: tl.constexpr):
    """SLOTS: this program's token, its valid slots, their pair indices and expert ids (int64); PAST_L1:
    the ids read at L2 (.cg)."""
    token = tl.program_id(1)
    offs_s = tl.arange(0, SLOTS)
    valid = offs_s < top_k
    pairs = token * top_k + tl.where(valid, offs_s, 0)
    if PAST_L1:
        e = tl.load(topk_ids_ptr + pairs, cache_modifier=".cg")
    else:
        e = tl.load(topk_ids_ptr + pairs)
    return token, valid, pairs, e.to(tl.int64)


@triton.jit
def moe_gemv_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, topk_weights_ptr, topk_ids_ptr,
    N, K, alpha, limit, top_k, rows_per_expert,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn, stride_bias_e,
    stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
    A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
    MUL_WEIGHTS: tl.constexpr, QUANT: tl.constexpr, GROUP_K: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WORDS: tl.constexpr = False, FP4_BITS: tl.constexpr = True,
    JOINT: tl.constexpr = False, SLOTS: tl.constexpr = 0, REDUCE: tl.constexpr = 2, LOADS: tl.constexpr = 0,
    EARLY: tl.constexpr = False, A_EXP: tl.constexpr = 0, PDL: tl.constexpr = False,
):  # fmt: skip
    """c[pair, n] for one pair (program axis 1) and BLOCK_N columns (axis 0): A row pair // A_ROW_DIV,
    B the pair's expert's [N (x2 when GATED), K] matrix. JOINT (GATED): the gate and up rows in one
    pass over K, which shares the activation's loads and keeps twice the weight loads in flight.
    SLOTS (a power of two >= top_k; not GATED): program axis 1 is a token, and its top_k pairs'
    weighted results are summed in registers and stored at c[token] (no per-slot buffer, no sum
    launch); the stacked weight is read as [E * rows_per_expert, K] rows.
    EARLY (w2 with SLOTS, MXFP4 words, LOADS 1 / 2; PDL): the expert ids and the first K step's weight words
    and scales are loaded before the PDL wait, so that they stream while w13 drains. No launch between
    writes them: the ids are the router's, two launches back, and w13 (the launch before) lets this one
    start only after its own wait, i.e. once the router has finished (read past L1 all the same).
    A_EXP (MXFP4 words in half pairs, gemv_w4.FP4_HALF2): a bound on the activations' magnitude as a float32
    exponent field (gemv_w4.half2_bound_exp; w2 after gpt-oss's clamped activation), in place of the pass over
    each row for its largest; 0: the pass."""
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    if EARLY:
        tl.static_assert(SLOTS > 0 and QUANT == 2 and WORDS and LOADS != 0, "moe_gemv EARLY: w2's MXFP4 slots")
        token, valid, pairs, e = _slot_experts(topk_ids_ptr, top_k, SLOTS, True)
        words0, s0 = w4_step_weights(b_ptr, b_scale_ptr, (e[:, None] * rows_per_expert + rn[None, :])[:, :, None], 0,
                                     K // 8, stride_bn, stride_bsn, stride_bsk, GROUP_K, EVEN_K, BLOCK_K // 8)  # fmt: skip
    pdl_wait(PDL)
    if SLOTS:
        if not EARLY:
            token, valid, pairs, e = _slot_experts(topk_ids_ptr, top_k, SLOTS, False)
            words0, s0 = None, None  # FIRST off: _row_dot loads step 0 itself
        acc = _row_dot(a_ptr, (pairs // A_ROW_DIV).to(tl.int64), a_scale_ptr, b_ptr, b_scale_ptr,
                       e[:, None] * rows_per_expert + rn[None, :], K, stride_am, stride_ak, stride_asm, stride_ask,
                       stride_bn, stride_bk, stride_bsn, stride_bsk, QUANT, GROUP_K, EVEN_K, WORDS, FP4_BITS, SLOTS,
                       REDUCE, BLOCK_N, BLOCK_K, LOADS, EARLY, words0, s0, A_EXP)  # fmt: skip
        moe_store(acc, acc, c_ptr, bias_ptr, topk_weights_ptr, pairs, valid, e[:, None], rn, offs_n, N, alpha, limit,
                  stride_cm, stride_cn, stride_bias_e, False, ACTIVATION, HAS_BIAS, MUL_WEIGHTS,
                  tl.full([1], 0, tl.int32) + token)  # fmt: skip
        return
    pair = tl.program_id(1)
    e = tl.load(topk_ids_ptr + pair).to(tl.int64)
    row = (pair // A_ROW_DIV).to(tl.int64)
    b_ptr += e * stride_be
    b_scale_ptr += e * stride_bse
    if GATED and JOINT:  # rows gate n, up n, gate n + 1, ...: one pass, then the two halves apart
        both = _row_dot(a_ptr, row, a_scale_ptr, b_ptr, b_scale_ptr, tl.reshape(tl.join(rn, rn + N), [2 * BLOCK_N]), K,
                        stride_am, stride_ak, stride_asm, stride_ask, stride_bn, stride_bk, stride_bsn, stride_bsk,
                        QUANT, GROUP_K, EVEN_K, WORDS, FP4_BITS, 0, REDUCE, 2 * BLOCK_N, BLOCK_K, LOADS)  # fmt: skip
        acc, acc_up = tl.split(tl.reshape(both, [BLOCK_N, 2]))
    else:
        acc = _row_dot(a_ptr, row, a_scale_ptr, b_ptr, b_scale_ptr, rn, K, stride_am, stride_ak, stride_asm,
                       stride_ask, stride_bn, stride_bk, stride_bsn, stride_bsk, QUANT, GROUP_K, EVEN_K, WORDS,
                       FP4_BITS, 0, REDUCE, BLOCK_N, BLOCK_K, LOADS, A_EXP=A_EXP)  # fmt: skip
        acc_up = acc
        if GATED:  # w13's up rows, N below the gate rows
            acc_up = _row_dot(a_ptr, row, a_scale_ptr, b_ptr, b_scale_ptr, rn + N, K, stride_am, stride_ak,
                              stride_asm, stride_ask, stride_bn, stride_bk, stride_bsn, stride_bsk, QUANT, GROUP_K,
                              EVEN_K, WORDS, FP4_BITS, 0, REDUCE, BLOCK_N, BLOCK_K, LOADS)  # fmt: skip
    pairs = tl.full([1], 0, tl.int32) + pair
    moe_store(acc[None, :], acc_up[None, :], c_ptr, bias_ptr, topk_weights_ptr, pairs, pairs >= 0, e, rn, offs_n, N,
              alpha, limit, stride_cm, stride_cn, stride_bias_e, GATED, ACTIVATION, HAS_BIAS, MUL_WEIGHTS)  # fmt: skip
