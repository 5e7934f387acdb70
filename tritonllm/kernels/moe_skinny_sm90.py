"""The fused MoE's experts at decode sizes for NVIDIA Hopper, 16-bit weights streamed by TMA, in Gluon.

At a decode step the experts' weight read is the whole cost of a MoE layer, and the portable GEMV (kernels/
moe_gemv.py) loads each expert's rows into registers. This kernel was built on the guess that the GEMV's read was
bound by what an SM holds in flight that way; Nsight Compute on the H200 (session 51, experiments/moe/README.md)
says otherwise for 16-bit experts: at Qwen3-30B-A3B's one-token layer the GEMV's w13 reads 50 MB at 2.93 TB/s and
this kernel's at 2.88, each launch ~18 us, with its ring holding far more bytes in flight.

The kernel is the dense skinny GEMM's (kernels/gemm_skinny_sm90.py) TMA ring and MMA run per (token, slot) pair:
each program streams BLOCK_N rows of its pair's expert (the stacked experts read as one [E * rows, K]
matrix through one tensor descriptor, the expert's first row e * rows from topk_ids) over its K range, and the
pair's activation row as the MMA's N (8 columns: TMA's box of 8 rows from the pair's row, of which column 0 is
the pair's; rows past the matrix arrive as zeros), c^T = w . a^T as the dense kernel takes it.

Two launches a layer, no alignment, no per-slot buffer and no sum after:

1. w13 (GATED): a program's rows are BLOCK_N / 2 gate rows n.. and the matching up rows I + n.. of its pair's
   expert (two TMA boxes a stage, as the dense gated mode); grid (cdiv(I, BLOCK_N / 2), pairs, K splits). The
   activation (SiLU, or gpt-oss's clamped swiglu_oai) with w13's bias gives intermediate[pair, n..].
2. w2 (slots summed): grid (cdiv(H, BLOCK_N), tokens, top_k x K splits): each program one slot (and K split)
   of a token, its partial times the slot's top-k weight (plus w2's bias once a slot); the token's row of the
   output is the sum of its slots, taken in the kernel.

Every program writes its BLOCK_N float32 sums (column 0 of the accumulator) to a workspace [rows, tiles, parts,
BLOCK_N] and counts its arrival on its (row, tile)'s counter (launch.arrival_counters, left at zero); the last
to arrive sums the parts in order (deterministic), applies the epilogue and stores in x's dtype. w2's ids were
written two launches back (the router's, before w13), so its programs read them and request their first weight
stages before the PDL wait, under w13's tail; w13 waits first (its router is the launch just before).

On by default for block-FP8 experts at decode sizes (up to 8 tokens), opt-in elsewhere (TRITONLLM_MOE_SKINNY=1;
=0 off): block FP8 is where it pays (5-22% faster on the H200 at 1-8 tokens, 9% on the H100 at one token; AUTO's
comment), 16-bit experts time level with the GEMV. Gluon does not run in the interpreter, so the CPU only builds it
(tests/kernels/test_moe_skinny_sm90.py); its numerics are GPU tests.
Takes bf16 / fp16 experts (the float GEMV's work: Qwen3-MoE, Mixtral, bf16 gpt-oss) stacked [E, N, K] with
16-byte aligned rows, and block-FP8 experts (e4m3 [E, N, K] with float32 scales [E, cdiv(N, 128), cdiv(K, 128)], as
Qwen3-30B-A3B-FP8 ships): their activations quantized per token and 128-column group first (quant.py, as the
portable path does), a K step of 128 FP8 values is one group, so each step's product is taken into fresh
registers and added times its activation scale and its rows' weight-block scale (gate and up rows: their two
blocks), two steps an iteration so that the MMAs stay back to back (gemm_skinny_sm90's group-scaled loop). At the
decode sizes the tile table gives the GEMV.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton

from tritonllm import platform
from tritonllm.kernels import gemm_skinny_sm90 as skinny
from tritonllm.kernels.launch import (
    MAX_ARRIVAL_COUNTERS,
    arrival_counters,
    compile_gluon_sm90,
    gluon_barrier,
    gluon_pdl_wait,
    gluon_sm90_available,
    pdl_launch,
)
from tritonllm.kernels.quant import quantize_per_group
from tritonllm.kernels.quant_formats import BLOCK, QuantizedWeight
from tritonllm.kernels.reference import MOE_ACTIVATIONS  # ACTIVATION: the index in it

HAVE_GLUON = skinny.HAVE_GLUON
if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

    from tritonllm.kernels.gemm_skinny_sm90 import _issue, _issue_w, _refill, _step_mma, release_ring, ring_barriers
    from tritonllm.kernels.gemv_w4_sm90 import _activation  # moe_epilogue.moe_activation, as Gluon calls it

BLOCK_M = 8  # the MMA's N: a pair's row and the 7 after it (unused)
FP8_BLOCK = "fp8:block:group"  # the quantized experts served (QuantizedWeight's format name)


def block_k(element_size: int) -> int:
    """Values of a K step: one 128-byte swizzled box a row (64 16-bit values; 128 FP8 values, one scale group)."""
    return skinny.ROW_BYTES // element_size


@dataclass(frozen=True)
class Plan:
    block_n: int = 64  # weight rows a program: one warpgroup MMA's 64 rows (w13: 32 gate + 32 up)
    stages: int = 6  # ring stages (weight and activation tiles of a K step each)
    fill: int = 4  # programs an SM the K splits aim the grid at (as the dense kernel's M = 1 plan)

    @classmethod
    def parse(cls, text: str) -> Plan:
        """ "BLOCK_N:STAGES:FILL"."""
        return cls(*(int(v) for v in text.split(":")))


def _mode_from_env() -> tuple[Plan | None, bool]:
    """(PLAN, AUTO) from TRITONLLM_MOE_SKINNY: "auto" (unset) the default plan where AUTO's comment says it pays,
    "1" the default plan everywhere it fits, "BLOCK_N:STAGES:FILL" that plan everywhere (sweeps), "0" off."""
    text = os.environ.get("TRITONLLM_MOE_SKINNY", "auto")
    if text in ("0", ""):
        return None, False
    if text == "auto":
        return Plan(), True
    return (Plan() if text == "1" else Plan.parse(text)), False


# AUTO: block-FP8 experts at up to AUTO_FP8_TOKENS tokens (where the tile table gives the GEMV). Measured (Qwen3-
# 30B-A3B-FP8's layer, graph replay, us, Triton GEMV -> this kernel; experiments/moe/README.md): the H200 (session
# 51) 30.9 -> 26.5, 49.0 -> 38.0, 62.6 -> 58.8, 101.2 -> 91.9 at 1 / 2 / 4 / 8 tokens; the H100 35.5 -> 32.4 at one
# token (sessions 49-50), level at four (75.2 / 74.8). 16-bit experts stay on the Triton GEMV: level on the H200 at
# 1-8 tokens (35.4 / 34.7, 53.5 / 52.8, 88.8 / 89.7, 144.8 / 144.9), on the H100 level at one token and 5% slower at
# four.
AUTO_FP8_TOKENS = 8
# Tests set PLAN and AUTO directly.
PLAN, AUTO = _mode_from_env()


def enabled() -> bool:
    return PLAN is not None


def split_of(programs: int, k: int, plan: Plan, step: int = 64) -> tuple[int, int]:
    """(K splits, columns a split: whole K steps of `step` columns) for a launch of `programs` programs without
    splits over K: split until about plan.fill programs an SM, at most 8 ways, each split at least four K steps."""
    steps = triton.cdiv(k, step)
    split = max(1, min(8, steps // 4, plan.fill * platform.num_multiprocessors() // max(programs, 1)))
    per_split = triton.cdiv(triton.cdiv(k, split), step) * step
    return triton.cdiv(k, per_split), per_split


def _rows_fit(w: torch.Tensor) -> bool:
    """Stacked [E, N, K] experts that read as one [E * N, K] matrix through TMA: N rows apart, unit column
    stride, 16-byte aligned rows and base."""
    return (
        w.dim() == 3 and w.stride(2) == 1 and w.stride(0) == w.shape[1] * w.stride(1)
        and (w.stride(1) * w.element_size()) % 16 == 0 and w.data_ptr() % 16 == 0
    )  # fmt: skip


def _block_scales_fit(w: QuantizedWeight) -> bool:
    """Block-FP8 experts as this kernel reads them: e4m3 data, float32 scales [E, cdiv(N, 128), cdiv(K, 128)]."""
    e, n, k = w.data.shape
    return (
        w.scheme.format_name == FP8_BLOCK and w.data.dtype == torch.float8_e4m3fn and w.scale.dtype == torch.float32
        and tuple(w.scale.shape) == (e, triton.cdiv(n, BLOCK), triton.cdiv(k, BLOCK))
    )  # fmt: skip


def _data(w) -> torch.Tensor:
    """The experts' values [E, N, K]: a 16-bit tensor itself, block FP8's e4m3 data."""
    return w.data if isinstance(w, QuantizedWeight) else w


def _experts_fit(w, x: torch.Tensor) -> bool:
    """16-bit experts of x's dtype, or block-FP8 ones, that TMA reads as they lie."""
    if isinstance(w, QuantizedWeight):
        return _block_scales_fit(w) and _rows_fit(w.data) and platform.has_fp8()
    return isinstance(w, torch.Tensor) and w.dtype == x.dtype and _rows_fit(w)


def takes(x: torch.Tensor, w13, w2, top_k: int, activation: str) -> bool:
    """Whether fused_moe runs this kernel: switched on (by default: block-FP8 experts at up to AUTO_FP8_TOKENS
    tokens), 16-bit experts of x's dtype or block-FP8 experts (both the same) that TMA reads as they lie, rows of x
    and of the intermediate 16-byte aligned (FP8: the intermediate's columns whole 32-row gate / up tiles of 128-row
    scale blocks), the counters enough for the grid, an sm90 GPU whose Triton compiles the kernel."""
    if not (enabled() and HAVE_GLUON and x.dtype in (torch.bfloat16, torch.float16)):
        return False
    if AUTO and not (isinstance(w13, QuantizedWeight) and x.shape[0] <= AUTO_FP8_TOKENS):
        return False  # the cases measured faster (AUTO's comment)
    if isinstance(w13, QuantizedWeight) != isinstance(w2, QuantizedWeight):
        return False
    if activation not in MOE_ACTIVATIONS or not (_experts_fit(w13, x) and _experts_fit(w2, x)):
        return False
    t, h = x.shape
    i = _data(w2).shape[2]
    if (h * 2) % 16 or (i * 2) % 16 or not skinny.tma_ok(x):
        return False
    if isinstance(w13, QuantizedWeight) and (i % (PLAN.block_n // 2) or h % 16):
        return False  # a gate / up tile within one scale block; FP8 activation rows of whole 16 bytes
    tiles = max(triton.cdiv(i, PLAN.block_n // 2) * t * top_k, triton.cdiv(h, PLAN.block_n) * t)
    return tiles <= MAX_ARRIVAL_COUNTERS and arrival_counters(x.device) is not None and available()


@functools.cache
def available() -> bool:
    """An NVIDIA sm90 GPU and a Triton whose Gluon compiles the kernel (else the Triton GEMV, with a warning)."""
    return gluon_sm90_available(
        HAVE_GLUON, "MoE skinny GEMM", "the Triton MoE GEMV serves decode batches instead",
        lambda: compile_sm90(gated=True), lambda: compile_sm90(gated=False),
    )  # fmt: skip


def compile_sm90(gated: bool = True, dtype: torch.dtype = torch.bfloat16, activation: int = 0, bias: bool = False,
                 early: bool | None = None, plan: Plan | None = None, fp8: bool = False):  # fmt: skip
    """Compile for sm90 without a GPU (launch.compile_gluon_sm90): tests, available(). gated: w13's launch, else
    w2's (slots summed; early, its default: its first stages requested before the PDL wait); fp8: block-FP8
    experts (dtype: the model's, of the output)."""
    from triton.runtime.jit import mangle_type

    plan = plan or PLAN or Plan()
    w = torch.empty((plan.block_n, 256), dtype=torch.float8_e4m3fn if fp8 else dtype)
    out = "*fp16" if dtype == torch.float16 else "*bf16"
    constexprs = dict(BLOCK_N=plan.block_n, BLOCK_M=BLOCK_M, STAGES=plan.stages, GATED=gated, ACTIVATION=activation,
                      HAS_BIAS=bias, EARLY=(not gated) if early is None else early, SCALED=fp8, PDL=True)  # fmt: skip
    types = dict(w_desc=mangle_type(skinny.descriptor(w, plan.block_n // 2 if gated else plan.block_n)),
                 x_desc=mangle_type(skinny.descriptor(w, BLOCK_M)), c_ptr=out, ids_ptr="*i32", weights_ptr="*fp32",
                 bias_ptr=out, ws_ptr="*fp32", cnt_ptr="*i32", a_scale_ptr="*fp32", w_scale_ptr="*fp32",
                 alpha="fp32", limit="fp32")  # fmt: skip
    return compile_gluon_sm90(moe_skinny_sm90_kernel, constexprs, types, ("stride_cm",), num_warps=4)


def _launch(x: torch.Tensor, x_scale: torch.Tensor | None, w, c: torch.Tensor, ids: torch.Tensor,
            weights: torch.Tensor, bias: torch.Tensor | None, *, rows: int, n: int, a_row_div: int, parts_a_row: int,
            gated: bool, activation: int, alpha: float, limit: float, pdl: dict) -> None:  # fmt: skip
    """One launch: c[row, :n] for `rows` rows of c (w13: the pairs; w2: the tokens, parts_a_row = top_k slots
    each), the pair's activation row x[pair // a_row_div] (block-FP8 experts w: x FP8 with its group scales)."""
    plan = PLAN or Plan()
    data, w_scale = _data(w), (w.scale if isinstance(w, QuantizedWeight) else None)
    e, w_rows, k = data.shape
    half = plan.block_n // 2 if gated else plan.block_n
    tiles = triton.cdiv(n, half)
    split, per_split = split_of(tiles * rows * parts_a_row, k, plan, block_k(data.element_size()))
    parts = parts_a_row * split
    ws = torch.empty((rows, tiles, parts, plan.block_n), dtype=torch.float32, device=x.device)
    w_desc = skinny.descriptor(data.view(e * w_rows, k), half)
    scaled = w_scale is not None
    moe_skinny_sm90_kernel[(tiles, rows, parts)](
        w_desc, skinny.descriptor(x, BLOCK_M), c, ids, weights, bias if bias is not None else c, ws,
        arrival_counters(x.device), x_scale if scaled else ws, w_scale if scaled else ws, n, k, per_split, split,
        a_row_div, parts_a_row, w_rows, c.stride(0), bias.stride(0) if bias is not None else 0,
        *(x_scale.stride() if scaled else (0, 0)), *(w_scale.stride() if scaled else (0, 0, 0)), alpha, limit,
        BLOCK_N=plan.block_n, BLOCK_M=BLOCK_M, STAGES=plan.stages, GATED=gated, ACTIVATION=activation,
        HAS_BIAS=bias is not None, EARLY=not gated and pdl.get("PDL", False), SCALED=scaled, num_warps=4, **pdl,
    )  # fmt: skip


def _activations(a: torch.Tensor, w) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A GEMM's activations as the experts w take them: as they are, or (block FP8) quantized per token and
    128-column group (scales column-major, quant.quantize_per_group)."""
    return quantize_per_group(a, w.data.dtype, BLOCK) if isinstance(w, QuantizedWeight) else (a, None)


def fused_moe_skinny(x: torch.Tensor, w13, w2, weights: torch.Tensor, topk_ids: torch.Tensor, out: torch.Tensor, *,
                     activation: str, w13_bias: torch.Tensor | None, w2_bias: torch.Tensor | None, alpha: float,
                     limit: float, after_w13=None) -> torch.Tensor:  # fmt: skip
    """out [T, H] = the experts' sum for x [T, H] (takes() holds), weights the top-k weights as float32 [T * k]
    and topk_ids [T, k] int32: fused_moe's decode path on Hopper."""
    t, top_k = topk_ids.shape
    i = _data(w2).shape[2]
    ids = topk_ids.reshape(-1)
    ids = ids if ids.dtype == torch.int32 and ids.is_contiguous() else ids.to(torch.int32).contiguous()
    intermediate = torch.empty((t * top_k, i), dtype=x.dtype, device=x.device)
    pdl = pdl_launch()
    act = MOE_ACTIVATIONS.index(activation)
    _launch(*_activations(x, w13), w13, intermediate, ids, weights, w13_bias, rows=t * top_k, n=i, a_row_div=top_k,
            parts_a_row=1, gated=True, activation=act, alpha=alpha, limit=limit, pdl=pdl)  # fmt: skip
    if after_w13 is not None:
        after_w13()
    _launch(*_activations(intermediate, w2), w2, out, ids, weights, w2_bias, rows=t, n=out.shape[1], a_row_div=1,
            parts_a_row=top_k, gated=False, activation=act, alpha=alpha, limit=limit, pdl=pdl)  # fmt: skip
    return out


if HAVE_GLUON:

    @gluon.jit
    def _issue_first(w_desc, w_smem, ready, w_row, N, k0, steps, STEP_BYTES: gl.constexpr, GATED: gl.constexpr):
        """The ring's first STAGES - 1 steps: each stage's expected bytes and its weight rows (_issue_w)."""
        BK: gl.constexpr = w_desc.block_type.shape[1]
        STAGES: gl.constexpr = w_smem.shape[0]
        for i in gl.static_range(STAGES - 1):
            mbarrier.expect(ready.index(i), STEP_BYTES, pred=i < steps)
            _issue_w(w_desc, w_row, N, k0 + i * BK, ready.index(i), w_smem.index(i), i < steps, GATED)

    @gluon.jit
    def _scaled_steps(acc, w_smem, x_smem, ready, w_desc, x_desc, w_row, x_row, N, k0, steps, a_s, w_gate, w_up,
                      stride_ask, stride_wsk, STEP_BYTES: gl.constexpr, GATED: gl.constexpr, ACC: gl.constexpr):  # fmt: skip
        """Block FP8: acc + the sum over the split's K steps (one 128-value scale group each) of each step's product
        times its activation scale (a_s: the row's first step's) and its rows' weight-block scale (w_gate: the
        first rows' block; GATED, w_up: the up rows' block); two steps an iteration, the second's MMA issued before
        the first's product is waited for (gemm_skinny_sm90._group_scaled_steps' order), refills as the plain loop's."""
        STAGES: gl.constexpr = w_smem.shape[0]
        BLOCK_N: gl.constexpr = acc.shape[0]
        BLOCK_M: gl.constexpr = acc.shape[1]
        up_rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC)) >= BLOCK_N // 2
        dead0 = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ACC)
        dead1 = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ACC)
        whole = steps - steps % 2
        for base in range(0, whole, 2):
            s0 = _step_scale(a_s, w_gate, w_up, up_rows, base, stride_ask, stride_wsk, GATED)
            s1 = _step_scale(a_s, w_gate, w_up, up_rows, base + 1, stride_ask, stride_wsk, GATED)
            p0 = _step_mma(w_smem, x_smem, ready, base, dead0)
            _refill(w_desc, x_desc, w_smem, x_smem, ready, w_row, x_row, N, k0, base + STAGES - 1, steps,
                    STEP_BYTES, GATED)  # fmt: skip
            p1 = _step_mma(w_smem, x_smem, ready, base + 1, dead1)
            p0, p1 = warpgroup_mma_wait(num_outstanding=1, deps=(p0, p1))
            acc += p0 * gl.expand_dims(s0, 1)
            _refill(w_desc, x_desc, w_smem, x_smem, ready, w_row, x_row, N, k0, base + STAGES, steps, STEP_BYTES,
                    GATED)  # fmt: skip
            p1 = warpgroup_mma_wait(num_outstanding=0, deps=(p1,))
            acc += p1 * gl.expand_dims(s1, 1)
            dead0 = p0
            dead1 = p1
        if whole < steps:  # an odd last step (its refill would be past the end)
            s0 = _step_scale(a_s, w_gate, w_up, up_rows, whole, stride_ask, stride_wsk, GATED)
            p0 = warpgroup_mma_wait(num_outstanding=0, deps=(_step_mma(w_smem, x_smem, ready, whole, dead0),))
            acc += p0 * gl.expand_dims(s0, 1)
        return acc

    @gluon.jit
    def _step_scale(a_s, w_gate, w_up, up_rows, j, stride_ask, stride_wsk, GATED: gl.constexpr):
        """Step j's scale of each accumulator row: the activation's group scale times the row's weight block's."""
        wg = gl.load(w_gate + j * stride_wsk)
        if GATED:
            w = gl.where(up_rows, gl.load(w_up + j * stride_wsk), wg)
        else:
            w = gl.where(up_rows, wg, wg)  # (a vector in the rows' layout)
        return w * gl.load(a_s + j * stride_ask)

    @gluon.jit
    def moe_skinny_sm90_kernel(
        w_desc, x_desc, c_ptr, ids_ptr, weights_ptr, bias_ptr, ws_ptr, cnt_ptr, a_scale_ptr, w_scale_ptr, N, K,
        K_PER_SPLIT, SPLIT_K, A_ROW_DIV, SLOTS, ROWS_E, stride_cm, stride_be, stride_asm, stride_ask, stride_wse,
        stride_wsn, stride_wsk, alpha, limit,
        BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, GATED: gl.constexpr,
        ACTIVATION: gl.constexpr, HAS_BIAS: gl.constexpr, EARLY: gl.constexpr, SCALED: gl.constexpr = False,
        PDL: gl.constexpr = False,
    ):  # fmt: skip
        """c[row, n] for the program's tile of N (w13, GATED: BLOCK_N / 2 intermediate columns from as many gate
        and up rows; w2: BLOCK_N output columns), row program_id(1) (w13: a pair; w2: a token, its SLOTS slots
        summed), part program_id(2) (slot x SPLIT_K + K split). The ring's refills are the dense skinny GEMM's
        (_refill; GATED: the up rows N below the gate rows). The pair's expert is ids[pair]; its rows start at
        expert x ROWS_E in w_desc's [E * ROWS_E, K] view; its activation row is x[pair // A_ROW_DIV]. SCALED (block
        FP8): x and w in e4m3, a_scale [rows of x, K / 128] and w_scale [E, cdiv(ROWS_E, 128), K / 128] by strides."""
        WARPS: gl.constexpr = gl.num_warps()
        DT: gl.constexpr = w_desc.dtype
        BK: gl.constexpr = w_desc.block_type.shape[1]
        HALF: gl.constexpr = BLOCK_N // 2
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, BLOCK_M, 256 // DT.primitive_bitwidth])  # fmt: skip
        STEP_BYTES: gl.constexpr = (BLOCK_N + BLOCK_M) * BK * DT.primitive_bitwidth // 8
        TILE_N: gl.constexpr = HALF if GATED else BLOCK_N  # output columns a program

        pid_n = gl.program_id(0)
        row = gl.program_id(1)
        part = gl.program_id(2)
        tiles = gl.num_programs(0)
        parts = gl.num_programs(2)
        pair = row * SLOTS + part // SPLIT_K  # (w13: SLOTS 1, the row is the pair)
        k0 = (part % SPLIT_K) * K_PER_SPLIT
        steps = gl.cdiv(gl.minimum(K, k0 + K_PER_SPLIT) - k0, BK)
        n0 = pid_n * TILE_N
        x_row = pair // A_ROW_DIV

        w_smem = gl.allocate_shared_memory(DT, [STAGES, BLOCK_N, BK], w_desc.layout)
        ready = ring_barriers(STAGES)
        if EARLY:  # w2: ids written two launches back (the router's, before w13): the weights before the wait
            expert = gl.load(ids_ptr + pair)
            w_row = expert * ROWS_E + n0
            _issue_first(w_desc, w_smem, ready, w_row, N, k0, steps, STEP_BYTES, GATED)
        gluon_pdl_wait(PDL)
        if not EARLY:  # w13: the router, the launch just before, wrote the ids
            expert = gl.load(ids_ptr + pair)
            w_row = expert * ROWS_E + n0
            _issue_first(w_desc, w_smem, ready, w_row, N, k0, steps, STEP_BYTES, GATED)
        x_smem = gl.allocate_shared_memory(DT, [STAGES, BLOCK_M, BK], x_desc.layout)
        for i in gl.static_range(STAGES - 1):
            _issue(x_desc, x_row, k0 + i * BK, ready.index(i), x_smem.index(i), i < steps)

        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ACC)
        if SCALED:  # one scale group a K step: the row's and the rows' blocks' (gate and up rows N apart)
            group0 = k0 // BK
            a_s = a_scale_ptr + x_row * stride_asm + group0 * stride_ask
            w_e = w_scale_ptr + expert * stride_wse + group0 * stride_wsk
            w_gate = w_e + (n0 // 128) * stride_wsn
            w_up = w_e + ((N + n0) // 128) * stride_wsn
            acc = _scaled_steps(acc, w_smem, x_smem, ready, w_desc, x_desc, w_row, x_row, N, k0, steps, a_s, w_gate,
                                w_up, stride_ask, stride_wsk, STEP_BYTES, GATED, ACC)  # fmt: skip
        else:
            for i in range(steps):
                s = i % STAGES
                mbarrier.wait(ready.index(s), (i // STAGES) & 1)
                acc = warpgroup_mma(w_smem.index(s), x_smem.index(s).permute((1, 0)), acc, is_async=True)
                # at most this step's MMA in flight: the previous step's stage is free for step i + STAGES - 1
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                _refill(w_desc, x_desc, w_smem, x_smem, ready, w_row, x_row, N, k0, i + STAGES - 1, steps,
                        STEP_BYTES, GATED)  # fmt: skip
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        release_ring(ready, STAGES)

        # column 0 of the accumulator: the pair's sums (the other columns are the rows after it)
        m_acc = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ACC))
        sums = gl.sum(gl.where(gl.expand_dims(m_acc == 0, 0), acc, 0.0), axis=1)
        r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))
        if not GATED:  # w2: the slot's bias (its first K split only) and top-k weight, before the slots are summed
            if HAS_BIAS:
                first = (part % SPLIT_K) == 0
                b = gl.load(bias_ptr + expert * stride_be + n0 + r, mask=(n0 + r < N) & first, other=0.0)
                sums += b.to(gl.float32)
            sums = sums * gl.load(weights_ptr + pair)
        tile_ws = ws_ptr + ((row * tiles + pid_n) * parts).to(gl.int64) * BLOCK_N
        gl.store(tile_ws + part * BLOCK_N + r, sums)
        gluon_barrier()  # every thread's sums written before the (releasing) arrival, or the read below
        counter = cnt_ptr + row * tiles + pid_n
        if parts > 1:
            arrived = gl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        else:
            arrived = parts - 1
        if arrived == parts - 1:
            L: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
            j = gl.arange(0, TILE_N, layout=L)
            col = n0 + j
            ok = col < N
            total = gl.zeros([TILE_N], gl.float32, layout=L)
            for p in range(parts):  # in part order: deterministic
                total += gl.load(tile_ws + p * BLOCK_N + j, cache_modifier=".cg")
            if GATED:
                up = gl.zeros([TILE_N], gl.float32, layout=L)
                for p in range(parts):
                    up += gl.load(tile_ws + p * BLOCK_N + HALF + j, cache_modifier=".cg")
                if HAS_BIAS:
                    bias_e = bias_ptr + expert * stride_be
                    total += gl.load(bias_e + col, mask=ok, other=0.0).to(gl.float32)
                    up += gl.load(bias_e + N + col, mask=ok, other=0.0).to(gl.float32)
                total = _activation(total, up, alpha, limit, ACTIVATION)
            gl.store(c_ptr + row.to(gl.int64) * stride_cm + col, total.to(c_ptr.dtype.element_ty), mask=ok)
            if parts > 1:
                gl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")  # ready for the next launch
