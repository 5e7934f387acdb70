"""The MoE GEMV for MXFP4 experts on NVIDIA Hopper, in Gluon: the dense Gluon GEMV's K loop
(kernels/gemv_w4_sm90.py w4_rows_dot: layouts chosen by hand, so that no value changes threads inside
the loop, and a thread's words and activations are the same 16-byte runs) run for each (token,
expert) pair, with the MoE's epilogue: the expert's bias, the gated activation (w13: gate and up rows,
N apart, interleaved in one tile, so one pass over K gives both sums of a column to the same thread),
the pair's top-k weight (w2: summed over the token's slots in the launch, through a float32 workspace and arrival
counters, or, where the counters cannot serve, a row a slot that fused_moe sums; under PDL each w2 program reads its
expert id and first weights before the wait).

Why: the portable Triton GEMV (kernels/moe_gemv.py) moves 0.9-1.3 TB/s of MXFP4 experts (26-36% of
the H100's and H200's bandwidth; experiments/moe/README.md, session 28) where the dense Gluon GEMV
reads about 2 TB/s on the H200: in the Triton build, ptxas spreads a step's loads over the loop (the
last issued just before their use), and at Qwen3's K the activation changes layout through shared
memory every step; Triton picks those layouts, and they differ between its versions.

Opt-in (TRITONLLM_MOE_GEMV_GLUON=1): timed on the H200 (session 51) 20% faster than the portable GEMV at gpt-oss's
layer at four tokens with its own tiling (TILING), level at one, and slower end to end at batch 1 while its w2 left
the slot sum to a torch launch (before SUM_SLOTS and EARLY). Gluon does not run in the interpreter, so on the CPU
it is only compiled (tests/kernels/test_moe_gemv_sm90.py); its numerics are GPU tests. Takes MXFP4 experts read as
words at decode sizes (the GEMV's tiles), one pair a program column.
"""

from __future__ import annotations

import functools
import os

import torch
import triton

from tritonllm.kernels import gemv_w4_sm90 as dense
from tritonllm.kernels import splitk_sm90
from tritonllm.kernels.launch import arrival_counters, compile_gluon_sm90, gluon_pdl_wait, gluon_sm90_available

if dense.HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl


def enabled() -> bool:
    """TRITONLLM_MOE_GEMV_GLUON=1 turns the kernel on (for MXFP4 experts, where it takes the shape)."""
    return os.environ.get("TRITONLLM_MOE_GEMV_GLUON", "0") == "1"


def takes(a: torch.Tensor, k: int) -> bool:
    """Whether fused_moe runs this kernel for a GEMV launch on activations `a` [rows, K] (the operands' layout
    checked by `fits`): switched on, K whole MXFP4 groups, the activation read as the dense kernel reads it,
    an sm90 GPU whose Triton compiles it."""
    return (
        enabled() and dense.supported(1, k, 32) and a.stride(1) == 1 and a.dtype in (torch.bfloat16, torch.float16)
        and available()
    )  # fmt: skip


def fits(words: torch.Tensor, c: torch.Tensor) -> bool:
    """Whether the kernel reads these MXFP4 words [E, N, K / 8] and writes c [pairs, N] as they lie: word rows
    16-byte aligned (it loads them 16 bytes a lane), c's columns contiguous (it stores them so)."""
    return words.stride(1) % 4 == 0 and words.stride(2) == 1 and c.stride(1) == 1


@functools.cache
def available() -> bool:
    return gluon_sm90_available(
        dense.HAVE_GLUON,
        "MoE MXFP4 GEMV",
        "the portable Triton MoE GEMV serves MXFP4 experts instead",
        lambda: compile_sm90(gated=True),
        lambda: compile_sm90(gated=False),
        lambda: compile_sm90(gated=True, activation=0, bias=False),
        lambda: compile_sm90(gated=False, sum_slots=True),
    )


# The kernel's tiling (gemv_w4_sm90.Tiling): 8 rows a thread, every warp on its own rows, K tiles of 1,024 columns
# (gpt-oss's K = 2,880: 94% full), as the H200 timed best at gpt-oss's layer (session 51, experiments/moe/README.md:
# 85.9 us at 4 tokens against the dense kernel's 8:4 tiling's 112.0, one 4,096-column tile 70% full; 33.3 against 38.0
# at one token). TRITONLLM_MOE_GEMV_SM90_TILING="ROWS:WARPS_K:PREFETCH:MAXNREG" overrides it (sweeps).
TILING = dense.Tiling.parse(os.environ.get("TRITONLLM_MOE_GEMV_SM90_TILING", "8:1:0:0"))


def compile_sm90(gated: bool, even: bool = False, tiling: dense.Tiling | None = None, activation: int = 1,
                 bias: bool = True, half2: bool = False, sum_slots: bool = False):  # fmt: skip
    """Compile the kernel for sm90 without a GPU (w13 gated, by default with gpt-oss's activation and biases;
    activation 0 and no bias: Qwen3-MoE's; or w2 with the top-k weights, sum_slots: its slots summed in the launch
    and, as fused_moe launches that form under PDL, its first weights read before the wait); returns the compiled
    kernel. For tests and the availability probe."""
    t = tiling or TILING
    constexprs = dict(A_ROW_DIV=4 if gated else 1, GATED=gated, ACTIVATION=activation, HAS_BIAS=bias,
                      MUL_WEIGHTS=not gated, ROWS=t.rows, WARPS_K=t.warps_k, PREFETCH=t.prefetch, EVEN=even, PDL=True,
                      HALF2=half2, ONE_TILE=False, SUM_SLOTS=4 if sum_slots else 0, EARLY=sum_slots)  # fmt: skip
    types = dict(a_ptr="*bf16", w_ptr="*i32", c_ptr="*bf16", bias_ptr="*bf16", s_ptr="*u8",
                 topk_weights_ptr="*fp32", topk_ids_ptr="*i32", ws_ptr="*fp32", cnt_ptr="*i32", alpha="fp32",
                 limit="fp32")  # fmt: skip
    return compile_gluon_sm90(moe_w4_gemv_sm90_kernel, constexprs, types, ("a_ptr", "w_ptr", "s_ptr", "stride_am", "K"),
                              num_warps=dense.NUM_WARPS)  # fmt: skip


def _block_n(gated: bool) -> int:
    """Output columns a program (gated: half its weight rows)."""
    return TILING.block_n // (2 if gated else 1)


def sums_slots(tokens: int, top_k: int, n: int, device: torch.device) -> bool:
    """Whether w2's launch can sum each token's top_k slots itself (moe_w4_gemv_sm90's sum_slots): more than one slot,
    and an arrival counter for each of the tokens' row blocks (splitk_sm90.counters_serve)."""
    return top_k > 1 and splitk_sm90.counters_serve(tokens * triton.cdiv(n, _block_n(False)), device)


def moe_w4_gemv_sm90(a: torch.Tensor, words: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None,
                     scale: torch.Tensor, topk_weights: torch.Tensor | None, topk_ids: torch.Tensor, *, n: int,
                     k: int, a_row_div: int, gated: bool, activation: int, alpha: float, limit: float,
                     pdl: dict, sum_slots: bool = False, early: bool = False) -> None:  # fmt: skip
    """c[pair, :n] for every (token, slot) pair of topk_ids [T, top_k]: a's row pair // a_row_div against
    the pair's expert's MXFP4 rows (words [E, N (x2 gated), K / 8] int32, scale [E, N (x2), K / 32] e8m0),
    + bias [E, N (x2)], gated: activation(gate, up); topk_weights [T * top_k] float32: times the pair's.
    sum_slots (w2, sums_slots true): c[token, :n] the sum of its slots' rows instead, taken by the launch (each
    slot's float32 row into a workspace, the last of a row block's slots to arrive sums them in slot order).
    early (w2, under PDL): each program reads its expert id and first weights before the PDL wait (the ids are the
    router's, written two launches back; kernels/launch.pdl_wait)."""
    t = TILING
    tokens, top_k = topk_ids.shape
    half2 = dense.half2_on()
    ws, counters = c, c
    if sum_slots:
        if not sums_slots(tokens, top_k, n, c.device) or gated or topk_weights is None:
            raise ValueError("moe_w4_gemv_sm90: sum_slots is for w2's launch where sums_slots() allows it")
        ws = torch.empty((tokens, top_k, n), dtype=torch.float32, device=c.device)
        counters = arrival_counters(c.device)
    moe_w4_gemv_sm90_kernel[(triton.cdiv(n, _block_n(gated)), topk_ids.numel())](
        a, words, c, bias if bias is not None else c, scale, topk_weights if topk_weights is not None else scale,
        topk_ids, ws, counters, n, k, alpha, limit, top_k, a.stride(0), words.stride(0), words.stride(1), c.stride(0),
        bias.stride(0) if bias is not None else 0, scale.stride(0), scale.stride(1), scale.stride(2),
        *(dense.gemv_w4.HALF2_MASKS if half2 else dense.FP4_MASKS), A_ROW_DIV=a_row_div, GATED=gated,
        ACTIVATION=activation, HAS_BIAS=bias is not None, MUL_WEIGHTS=topk_weights is not None, ROWS=t.rows,
        WARPS_K=t.warps_k, PREFETCH=t.prefetch, EVEN=k % dense.tile_k(t) == 0, HALF2=half2,
        ONE_TILE=k <= dense.tile_k(t), SUM_SLOTS=top_k if sum_slots else 0,
        EARLY=early and not gated and pdl.get("PDL", False), num_warps=dense.NUM_WARPS, **pdl,
    )  # fmt: skip


if dense.HAVE_GLUON:

    @gluon.jit
    def moe_w4_gemv_sm90_kernel(
        a_ptr, w_ptr, c_ptr, bias_ptr, s_ptr, topk_weights_ptr, topk_ids_ptr, ws_ptr, cnt_ptr,
        N, K, alpha, limit, top_k, stride_am, stride_we, stride_wn, stride_cm, stride_bias_e, stride_se, stride_sn,
        stride_sk, m0, m1,
        A_ROW_DIV: gl.constexpr, GATED: gl.constexpr, ACTIVATION: gl.constexpr, HAS_BIAS: gl.constexpr,
        MUL_WEIGHTS: gl.constexpr, ROWS: gl.constexpr, WARPS_K: gl.constexpr, PREFETCH: gl.constexpr,
        EVEN: gl.constexpr, HALF2: gl.constexpr = False, ONE_TILE: gl.constexpr = False, SUM_SLOTS: gl.constexpr = 0,
        EARLY: gl.constexpr = False, PDL: gl.constexpr = False,
    ):  # fmt: skip
        """c[pair, n] for pair = program axis 1 and, on axis 0, BLOCK_N = ROWS x NUM_WARPS / WARPS_K weight rows
        a program: BLOCK_N columns n, or (GATED) BLOCK_N / 2 columns' gate rows n and up rows N + n. A row
        pair // A_ROW_DIV, B the pair's expert's rows; the MoE epilogue in kernels/moe_epilogue.py's order
        (bias, activation, top-k weight). ONE_TILE: K within one K tile (w4_rows_dot's). SUM_SLOTS (w2: top_k,
        a constexpr): c[token, n] the sum of the token's slots, through the float32 workspace ws [T, top_k, N] and
        one arrival counter a token and row block (gemv_w4_sm90.finish_rows_part). EARLY (w2 under PDL): the expert
        id (the router's, two launches back) and the first K tile's words and scales loaded before the wait."""
        BLOCK_N: gl.constexpr = ROWS * (dense._WARPS // WARPS_K)
        pair = gl.program_id(1)
        # MXFP4 rows are whole 16-byte runs (K a multiple of 32): said so, the words load 16 bytes a lane
        # even where the row stride is not a multiple of 16 words (gpt-oss's K = 2880: 360)
        stride_wn = stride_wn // 4 * 4
        if EARLY:
            e_early = gl.load(topk_ids_ptr + pair, cache_modifier=".cg").to(gl.int64)
            w0, s0, z0 = dense.first_weights(w_ptr + e_early * stride_we, s_ptr + e_early * stride_se,
                                             s_ptr + e_early * stride_se, gl.program_id(0) * BLOCK_N, N, K, stride_wn,
                                             stride_sn, stride_sk, 32, ROWS, WARPS_K, True, EVEN)  # fmt: skip
        gluon_pdl_wait(PDL)
        if EARLY:
            e = e_early
        else:
            e = gl.load(topk_ids_ptr + pair).to(gl.int64)
            w0, s0, z0 = None, None, None
        a_row = a_ptr + (pair // A_ROW_DIV).to(gl.int64) * stride_am
        w_e = w_ptr + e * stride_we
        s_e = s_ptr + e * stride_se
        if GATED:  # one pass over K: the tile's rows are gate and up rows of BLOCK_N / 2 columns, interleaved
            row0 = gl.program_id(0) * (BLOCK_N // 2)
            both, n_both = dense.w4_rows_dot(a_row, w_e, s_e, s_e, row0, N, K, stride_wn, stride_sn, stride_sk, m0,
                                             m1, True, 32, ROWS, WARPS_K, PREFETCH, EVEN, True, HALF2,
                                             ONE_TILE)  # fmt: skip
            out, n_out = dense.gated_epilogue(both, n_both, bias_ptr + e * stride_bias_e, N, alpha, limit,
                                              ACTIVATION, HAS_BIAS)  # fmt: skip
        else:
            out, n_out = dense.w4_rows_dot(a_row, w_e, s_e, s_e, gl.program_id(0) * BLOCK_N, N, K, stride_wn,
                                           stride_sn, stride_sk, m0, m1, True, 32, ROWS, WARPS_K, PREFETCH, EVEN,
                                           False, HALF2, ONE_TILE, w0, s0, z0)  # fmt: skip
            if HAS_BIAS:
                out += gl.load(bias_ptr + e * stride_bias_e + n_out, mask=n_out < N, other=0.0).to(gl.float32)
        if MUL_WEIGHTS:
            out = out * gl.load(topk_weights_ptr + pair)
        if SUM_SLOTS:  # the token's row block: this slot's part; the last slot to arrive sums them and stores
            token = pair // top_k
            dense.finish_rows_part(out, c_ptr + token.to(gl.int64) * stride_cm, c_ptr,
                                   ws_ptr + token.to(gl.int64) * top_k * N, cnt_ptr + token * gl.num_programs(0),
                                   gl.program_id(0), pair % top_k, top_k, N, 32, ROWS, WARPS_K, False,
                                   SUM_SLOTS)  # fmt: skip
        else:
            gl.store(c_ptr + pair.to(gl.int64) * stride_cm + n_out, out.to(c_ptr.dtype.element_ty), mask=n_out < N)
