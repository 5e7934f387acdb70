"""The 4-bit skinny GEMM (M = 2..64; beyond, in row blocks of 128, up to MAX_M) for NVIDIA Hopper, in Gluon:
tensor cores fed from registers.

At M = 1 the GEMV (gemv_w4_sm90.py) multiplies on the CUDA cores; from a few activation rows on,
its products (M per weight) outgrow the decode, and the portable tile kernel (gemm.py) wastes most
of a 16-row MMA and converts every decoded tile through shared memory (0.5-1.0x bf16 cuBLAS at
M = 4-64 on the H200). Here the product is taken transposed, c^T = w . a^T ("swap AB"): the weight
is the MMA's 64-row A operand, which Hopper's warpgroup MMA reads from registers, and the few
activation rows are its N (16, 32 or 64 columns), read from shared memory.

The packed weight is read as stored (int32 words of eight nibbles: nibble j of word w is column
8 w + j) in the register layout of the MMA's A operand, so the decoded values never move between
threads: a thread of the A layout holds rows r and r + 8 of its warp's 16 and, of each 16 columns
of a K tile, the four at 2 t, 2 t + 1, 2 t + 8, 2 t + 9 (t: its lane in the quad). Which physical
columns those are is ours to choose, since the product sums over K whatever the order: the thread
reads four contiguous words (32 columns, one 16-byte load a row) and the MMA's logical columns are
mapped onto them as the decode produces them; the activation tile is permuted the same way (in
registers) on its way to shared memory. Each word decodes with one shift and one LOP3 a pair of
nibbles (j, j + 4) into a bf16x2 (fp16x2) of 128 + q (1024 + q): the pair's two halves are the
MMA's adjacent columns. Then w = (x - 128) s - z s per pair, with the scale and zero point of the
thread's group (a thread's 32 columns lie in one group of 32, 64 or 128). MXFP4 (bf16 only): the
e2m1 magnitude and sign bits of a pair go under bf16's exponent (two shifts, two LOP3: value x
2**-126, the code 0.5 a subnormal) and one packed multiply by 2**(e - 64) applies the e8m0 scale:
the weight times 2**-63 (a normal bf16 for any scale a checkpoint carries: e in 64..190), the
activations times 2**63, their product exact. Plans (rows a program, K splits, prefetch, one to four
warpgroups) come from `plan`, swept by
experiments/quant4/gemm_sm90/sweep.py.

K splits (skinny grids) write float32 partials; the last split program of a tile to arrive (a counter
per tile, reset by that program) sums them in split order and writes the output: no second launch.

Beyond 64 rows (prefill chunks) a program takes 128 activation rows (the MMA's N) and the grid one program
per weight tile and row block (M_TILED), the row blocks of a tile adjacent in launch order so that all but
the first read its words from L2: the weight is decoded in registers once a row block, where the portable
path first writes the whole weight in 16 bits (int4 at M = 512 on Llama-3-8B's layers: 624 us a layer
against bf16 cuBLAS's 337, 200 of them the dequantize pass; session 38, H100). Timed in session 39 (H100,
int4 g128, Llama-3-8B layers, L2 cold): one row block (M = 65..128) runs 1.2-2.4x the dequantize-first path
(a layer's four linears at M = 65: 289 against 562 us), but from M = 256 decoding the weight again for every
row block loses (M = 512: 0.6-0.9x it; M = 2048: 0.45x). So gemm() sends M up to 128 here
(TRITONLLM_W4_SM90_MAX_M overrides it).

Plan.async_mma takes two K steps an iteration with the first's MMA asynchronous under the second's decode, both
retired before the loop's back edge (ptxas serializes every MMA of a loop that carries one in flight across it);
the default plans take it at M <= 16 and on the row blocks (ASYNC_MMA). Elsewhere the MMA is synchronous: a step's
decode, activation store and MMA follow one another.

The activation tiles are read from L2 by every program, not streamed by TMA: the column permutation above is at
2-byte granularity, which no copy engine does, so a tile would still pass through registers; a three-stage TMA ring
feeding them from shared memory was built and timed slower at every Llama-3-8B layer (session 44,
experiments/quant4/README.md) and removed.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import torch
import triton

from tritonllm import platform
from tritonllm.kernels import gemv_w4, splitk_sm90
from tritonllm.kernels.launch import compile_gluon_sm90, gluon_barrier, gluon_pdl_wait, gluon_sm90_available

try:  # recent triton ships Gluon; without it the portable kernels serve every shape
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older triton
    HAVE_GLUON = False

BLOCK_K = 128  # columns a K step: a thread's four words a row
# the largest M gemm() sends here, where measured faster (M = 65..128: one row block; session 39)
MAX_M = int(os.environ.get("TRITONLLM_W4_SM90_MAX_M", "128"))
SKINNY_MAX_M = 64  # one program's rows at most (the MMA's N: 16, 32, 64), the decode-size plans
ROWS_M = 128  # activation rows a program beyond SKINNY_MAX_M
# the decode's masks as kernel arguments (as literals ptxas re-materialises them before each LOP3)
INT4_PAIR_MASK = 0x000F000F
BF16_BIAS = 0x43004300  # bf16x2 (128, 128): nibbles in the low mantissa bits read 128 + q
FP16_BIAS = 0x64006400  # fp16x2 (1024, 1024)
FP4_MASKS = gemv_w4.FP4_PAIR_MASKS  # e2m1 magnitudes at bf16 bits 6..8 / 22..24, signs at 15 / 31


@dataclass(frozen=True)
class Plan:
    block_n: int  # weight rows a program (the MMA's M: 64 a warpgroup pass)
    split: int  # K splits (float32 partials, summed by each tile's last split program)
    # the next K step's loads issued before this step's decode and MMA (1); 2: the words, scales and zero
    # points two steps ahead and the activation tile one (more weight bytes in flight a program; opt-in: on the
    # H200 at M = 32..64 no better than 1, session 22); 0: none
    prefetch: int = 1
    warps: int = 4  # 4, 8 or 16: one, two or four warpgroups sharing each activation tile
    # int4 with groups of 128 (a K step is one group): the decode leaves the scale out (q - z, exact) and
    # each step's MMA product is scaled in float32 (see _step_scale_after); other formats ignore it
    scale_after: bool = False
    # with prefetch 1 or 2, the activation tile loaded a step ahead too (True), or at its own step (False: its
    # registers freed: at M = 64 the kernel holds 181 registers a thread, two programs an SM; see _plan)
    x_ahead: bool = True
    # two K steps an iteration, the second's decode under the first step's MMA issued asynchronously, both
    # retired before the back edge; taken only where every split has an even number of K steps, and there it
    # replaces scale_after (the scale goes into the decode). The default plans take it at M <= ASYNC_MAX_M and
    # beyond SKINNY_MAX_M (ASYNC_MMA, session 43's H100 sweeps)
    async_mma: bool = False

    @classmethod
    def parse(cls, text: str) -> Plan:
        """ "BLOCK_N:SPLIT:PREFETCH[:WARPS[:SCALE_AFTER[:X_AHEAD[:ASYNC_MMA]]]]"."""
        block_n, split, prefetch, *rest = (int(v) for v in text.split(":"))
        return cls(block_n, split, prefetch, *rest[:1], *(bool(v) for v in rest[1:]))


# sweeps (experiments/quant4/gemm_sm90/sweep.py) set this to time one plan at every shape
PLAN_OVERRIDE: Plan | None = None
# the scale applied after each step's MMA (Plan.scale_after) in the default plans, int4 only: on at
# M <= 32, where the H200 timed it 0-6% faster at every Llama-3-8B layer (cold L2; gate_up M = 2: 33.1
# against 35.2 us) and the int4 decode step 1.5% faster at 4 and 16 sequences; off at M = 64 (gate_up's
# two-warpgroup plan 68.5 against 50.9 us, down 36.3 against 35.1). TRITONLLM_W4_SCALE_AFTER=1 / 0
# forces it on / off everywhere (experiments/quant4/README.md, session 21)
SCALE_AFTER = os.environ.get("TRITONLLM_W4_SCALE_AFTER", "auto")
SCALE_AFTER_MAX_M = 32
# Plan.async_mma in the default plans. "auto": at M <= ASYNC_MAX_M and beyond SKINNY_MAX_M (the row blocks), where
# session 43's H100 sweeps (experiments/quant4/README.md; Llama-3-8B layers, L2 cold) timed it faster at every layer
# or within 1%: int4 M = 16 gate_up 35.7 against 38.0 us (with the scale after the MMA), down 23.9 / 25.6; M = 65 / 128
# gate_up 97.6 / 112.8 against 114.1 / 138.7 (128 rows, the activation at its step), down 80.2 / 97.9 against 100.7
# / 110.1 (64 rows in two splits); MXFP4 2-11% at the same sizes. Not at M = 32..64, where it lost up to 35% (int4
# qkv at M = 64 25.5 against 18.9, gate_up 63.6 / 51.7). "1" / "0": everywhere / nowhere (TRITONLLM_W4_ASYNC_MMA;
# the sweep's auto_async is "1")
ASYNC_MMA = os.environ.get("TRITONLLM_W4_ASYNC_MMA", "auto")
if ASYNC_MMA not in ("auto", "0", "1"):
    raise ValueError(f"TRITONLLM_W4_ASYNC_MMA={ASYNC_MMA!r}: auto, 0 or 1")
ASYNC_MAX_M = 16


def measured_faster(m: int, n: int, k: int, fp4: bool = False) -> bool:
    """Where the H200 measured this kernel faster than the portable ones (experiments/quant4/README.md,
    session 13): at every Llama-3-8B shape and M = 2..64 (1.2-1.9x bf16 at M = 2..16 where the portable
    kernels ran 0.75-1.0x) but qkv at M = 64, where the two are within 5% (24.6 / 23.4 us in the last
    sweep, 20.2 / 23.3 in the first): taken there too, one kernel for the bucket. MXFP4 (session 14): 1.7-3.4x
    the portable kernels at every shape and M = 2..64. Beyond, one row block (M = 65..128: 1.2-2.4x the
    portable dequantize-first path, int4 on an H100, session 39) as far as MAX_M."""
    return 2 <= m <= MAX_M


def block_m(m: int) -> int:
    """The MMA's N (activation rows a program): 16, 32 or 64 (a power of two covering m); beyond 64, 128
    (row blocks: m_blocks)."""
    return 16 if m <= 16 else 32 if m <= 32 else 64 if m <= SKINNY_MAX_M else ROWS_M


def m_blocks(m: int) -> int:
    """Row blocks of block_m(m) rows (programs a weight tile): one up to 128 rows."""
    return triton.cdiv(m, block_m(m))


def plan(m: int, n: int, k: int, fp4: bool = False) -> Plan:
    """Rows a program and K splits for a shape, from the H200's sweeps (experiments/quant4/README.md,
    session 13): 64 rows a program, the next step prefetched, and K split until the grid holds about
    four programs an SM (at most 4 splits, each at least four K steps; more splits cost more than they
    hide: float32 partials [split, M, N]); above M = 16, where 128-row programs alone fill the SMs (gate_up),
    two warpgroups a program sharing each activation tile, no split (M = 64: 50.5 against 68.5 us)."""
    if PLAN_OVERRIDE is not None:
        return PLAN_OVERRIDE
    on = m <= SCALE_AFTER_MAX_M if SCALE_AFTER == "auto" else SCALE_AFTER == "1"
    asynchronous = (m <= ASYNC_MAX_M or m > SKINNY_MAX_M) if ASYNC_MMA == "auto" else ASYNC_MMA == "1"
    return replace(_plan(m, n, k, fp4, asynchronous), scale_after=on and not fp4, async_mma=asynchronous)


def _plan(m: int, n: int, k: int, fp4: bool, asynchronous: bool = False) -> Plan:
    if m > SKINNY_MAX_M:
        return _rows_plan(m, n, k, fp4, asynchronous)
    if fp4 and m > 32 and triton.cdiv(n, 128) >= platform.num_multiprocessors():
        return Plan(256, 1, True, 16)  # MXFP4 gate_up at M = 64: 56.6 against 66.0 us with two warpgroups
    if m > 16 and triton.cdiv(n, 128) >= platform.num_multiprocessors():
        return Plan(128, 1, True, 8)
    programs = triton.cdiv(n, 64)
    split = _k_split(programs, k, 4)
    # 64-row tiles (M > 32) hold 181 registers a thread with the activation loaded a step ahead: two programs
    # an SM. Where the grid needs more than that wave, the activation at its own step (128 registers, four an
    # SM) wins: int4 qkv (6144 x 4096, 384 programs) at M = 48 / 64 ran 17.5 / 18.7 us against 23.5 / 25.3;
    # within one wave it loses or ties (down 40.4 against 34.6, o 15.3 against 15.2; session 22). MXFP4 alike
    # (session 44, H100: qkv at M = 48 / 64 19.5 / 20.5 us against 24.6 / 25.8, 1.12x / 1.01x bf16 from 0.89x /
    # 0.80x; o 16.7 against 14.3 a step ahead)
    x_ahead = m <= 32 or programs * split <= 2 * platform.num_multiprocessors()
    return Plan(64, split, x_ahead=x_ahead)


def _rows_plan(m: int, n: int, k: int, fp4: bool, asynchronous: bool) -> Plan:
    """Beyond 64 rows: two warpgroups on 128 weight rows where the grid of weight tiles x row blocks fills the
    SMs, else one warpgroup on 64 (two an SM), its K split in at least two while one row block covers M
    (partials are per tile). Session 39's sweep (int4, H100, M = 65 / 128): qkv's 96 tiles ran 37.4 / 41.7 us in
    two splits against 41.2 / 45.9 in one, o's and down's 64 tiles took two already. The 128-row plan loads the
    next step's activation tile a step ahead (216 registers a thread int4, 231 MXFP4 on Triton 3.6, no spills:
    one program an SM as with it at its own step, 184 / 193): on two H100s it ran faster at every M timed,
    gate_up int4 112.4 / 135.0 us against 118.8 / 137.3 at M = 65 / 128 (session 39; 2-7% up to M = 2048), MXFP4
    111.6 / 133.6 against 134.0 / 152.4 (session 42; 9-17% up to M = 256). The 64-row plan keeps the activation
    at its own step: a step ahead it spills (255 registers and a 152-byte stack). With the asynchronous MMA (plan()'s
    default here) int4's 128-row plan is fastest with the activation at its own step, MXFP4's a step ahead (session 43,
    H100: int4 gate_up 97.6 / 112.8 us against 106.9 / 120.9 a step ahead at M = 65 / 128; MXFP4 103.3 / 122.4 against
    109.5 / 121.1 at its step)."""
    blocks = m_blocks(m)
    if triton.cdiv(n, 128) * blocks >= platform.num_multiprocessors():
        return Plan(128, 1, True, 8, x_ahead=fp4 or not asynchronous)
    split = max(min(2, k // (4 * BLOCK_K)), _k_split(triton.cdiv(n, 64), k, 1)) if blocks == 1 else 1
    return Plan(64, split, True, 4, x_ahead=False)


def _k_split(programs: int, k: int, per_sm: int) -> int:
    """K splits of a grid of `programs` tiles: until about per_sm programs an SM, at most 4, each split at least
    four K steps."""
    return max(1, min(4, round(per_sm * platform.num_multiprocessors() / programs), k // (4 * BLOCK_K)))


def even_steps(k: int, k_per_split: int) -> bool:
    """Whether every K split (k_per_split columns, the last one what is left of k) takes an even number of
    BLOCK_K steps: the ASYNC_MMA loop's two steps an iteration."""
    return (k // BLOCK_K) % 2 == 0 and (k_per_split // BLOCK_K) % 2 == 0


def supported(m: int, k: int, group_k: int) -> bool:
    """Whether this kernel takes the shape: two or more activation rows (beyond 64 in row blocks), K whole
    128-column steps, groups of 32, 64 or 128 columns."""
    return HAVE_GLUON and 2 <= m and k % BLOCK_K == 0 and group_k in (32, 64, 128)


def takes(a: torch.Tensor, k: int, group_k: int, fp4: bool = False) -> bool:
    """Whether gemm() can run this kernel for activations a [M, K] (and a 4-bit weight read as words):
    the shape supported, 16-bit activations with unit column stride (MXFP4: bf16, whose exponent range
    holds every e8m0 scale), an sm90 GPU."""
    dtypes = (torch.bfloat16,) if fp4 else (torch.bfloat16, torch.float16)
    return supported(a.shape[0], k, group_k) and a.stride(1) == 1 and a.dtype in dtypes and available()


@functools.cache
def available() -> bool:
    """An NVIDIA sm90 GPU and a Triton whose Gluon compiles the kernel (else, with a warning, the
    portable kernels serve every shape)."""
    return gluon_sm90_available(
        HAVE_GLUON,
        "W4 GEMM",
        "the portable Triton kernels serve 4-bit GEMMs instead",
        compile_sm90,
        lambda: compile_sm90(fp4=True),
    )


def compile_sm90(group_k: int = 128, block_n: int = 128, bm: int = 16, fp16: bool = False, split: int = 1,
                 prefetch: int = 1, warps: int = 4, fp4: bool = False, scale_after: bool = False,
                 x_ahead: bool = True, m_tiled: bool = False, async_mma: bool = False):  # fmt: skip
    """Compile for sm90 without a GPU (launch.compile_gluon_sm90): tests, scripts/sass_loop_mix.py,
    available()."""
    constexprs = dict(GROUP_K=32 if fp4 else group_k, BLOCK_N=block_n, BLOCK_M=bm, FP16=fp16, FP4=fp4,
                      HAS_BIAS=False, SPLIT_K=split, PREFETCH=prefetch, SCALE_AFTER=scale_after, PDL=True,
                      X_AHEAD=x_ahead, M_TILED=m_tiled, ASYNC_MMA=async_mma)  # fmt: skip
    act = "*fp16" if fp16 else "*bf16"
    scale = "*u8" if fp4 else "*fp16"
    types = dict(a_ptr=act, w_ptr="*i32", c_ptr=act, bias_ptr=act, s_ptr=scale, z_ptr=scale, ws_ptr="*fp32",
                 cnt_ptr="*i32")  # fmt: skip
    aligned = ("a_ptr", "w_ptr", "K", "KW_PER_SPLIT", "stride_wn", "stride_am", "stride_cm")
    return compile_gluon_sm90(w4_gemm_sm90_kernel, constexprs, types, aligned, num_warps=warps)


def w4_gemm_sm90(a: torch.Tensor, words: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None,
                 scale: torch.Tensor, zero: torch.Tensor | None, group_k: int, fp4: bool,
                 pdl: dict) -> torch.Tensor:  # fmt: skip
    """c = a . w^T (+ bias) for a [M, K], the int32 word view [N, K / 8] of an int4 weight with scales
    and zero points [N, K / group_k], or (fp4; zero None) of an MXFP4 weight with e8m0 scales [N, K / 32].
    K splits write float32 partials; the last split program of a tile to arrive sums them in split
    order (deterministic) and writes c: one launch, no reduce kernel. Beyond 128 rows, row blocks of 128
    (a program each, no K split)."""
    (m, k), n = a.shape, words.shape[0]
    p = plan(m, n, k, fp4)
    blocks = m_blocks(m)
    split, k_per_split, tiles, ws, cnt = splitk_sm90.plan_splits(m, n, k, p.split if blocks == 1 else 1, BLOCK_K,
                                                                 p.block_n, c)  # fmt: skip
    async_mma = p.async_mma and even_steps(k, k_per_split)
    scale_after = p.scale_after and group_k == BLOCK_K and not fp4 and not async_mma
    w4_gemm_sm90_kernel[(tiles * blocks, split)](
        a, words, c, bias if bias is not None else c, scale, scale if fp4 else zero, ws, cnt,
        m, n, k, k_per_split // 8, a.stride(0), words.stride(0), c.stride(0), scale.stride(0), scale.stride(1),
        *(FP4_MASKS if fp4 else (INT4_PAIR_MASK, FP16_BIAS if a.dtype == torch.float16 else BF16_BIAS)),
        GROUP_K=group_k, BLOCK_N=p.block_n, BLOCK_M=block_m(m), FP16=a.dtype == torch.float16, FP4=fp4,
        HAS_BIAS=bias is not None, SPLIT_K=split, PREFETCH=int(p.prefetch),
        SCALE_AFTER=scale_after, num_warps=p.warps, X_AHEAD=p.x_ahead, M_TILED=blocks > 1, ASYNC_MMA=async_mma, **pdl,
    )  # fmt: skip
    return c


if HAVE_GLUON:

    @gluon.constexpr_function
    def _row_bases(block_n, warps):
        """Register bases of a thread's rows beyond its warp's 16: row + 8, then + 16 x warps, ..."""
        bases = [[8, 0]]
        r = 16 * warps
        while r < block_n:
            bases.append([r, 0])
            r *= 2
        return bases

    @gluon.constexpr_function
    def _words_layout(block_n, warps):
        """[BLOCK_N, 4, 4] words (row, quad lane t, word u): a thread holds words 4 t .. 4 t + 3 of rows
        r, r + 8 (+ 64 ...), the rows and quads of the MMA's A operand (t: lane % 4, r: lane / 4 + 16 warp)."""
        return gl.DistributedLinearLayout(
            reg_bases=[[0, 0, 1], [0, 0, 2]] + [[r, 0, 0] for r, _ in _row_bases(block_n, warps)],
            lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
            warp_bases=[[16 << i, 0, 0] for i in range(warps.bit_length() - 1)],
            block_bases=[],
            shape=[block_n, 4, 4],
        )

    @gluon.jit
    def _pair_int4(words, P: gl.constexpr, mask, bias, s2, zs2, DT: gl.constexpr):
        """Nibbles P and P + 4 of each word as the 16-bit floats (q - z) s, [..., 2] (low, high): one
        LOP3 puts them under the exponent of 128 (1024) as a bf16x2 (fp16x2) of 128 + q, then a packed
        subtract and a packed FMA with the thread's (s, s) and (-z s, -z s) (s2, zs2)."""
        x = words if P == 0 else words >> (4 * P)
        if DT == gl.float16:
            lo, hi = gl.inline_asm_elementwise(
                "{ .reg .b32 t; lop3.b32 t, $2, $3, $4, 0xEA; sub.f16x2 t, t, $4; fma.rn.f16x2 t, t, $5, $6; "
                "mov.b32 {$0, $1}, t; }", "=h,=h,r,r,r,r,r", [x, mask, bias, s2, zs2],
                dtype=(gl.float16, gl.float16), is_pure=True, pack=1)  # fmt: skip
        else:
            lo, hi = gl.inline_asm_elementwise(
                "{ .reg .b32 t; lop3.b32 t, $2, $3, $4, 0xEA; sub.bf16x2 t, t, $4; fma.rn.bf16x2 t, t, $5, $6; "
                "mov.b32 {$0, $1}, t; }", "=h,=h,r,r,r,r,r", [x, mask, bias, s2, zs2],
                dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=1)  # fmt: skip
        return gl.join(lo, hi)

    @gluon.jit
    def _pair_int4_unscaled(words, P: gl.constexpr, mask, bias, zb2, DT: gl.constexpr):
        """Nibbles P and P + 4 of each word as the 16-bit floats q - z, exact, [..., 2] (low, high): the LOP3
        of _pair_int4 (128 + q), then one packed subtract of the thread's (128 + z, 128 + z) (fp16: 1024)."""
        x = words if P == 0 else words >> (4 * P)
        if DT == gl.float16:
            lo, hi = gl.inline_asm_elementwise(
                "{ .reg .b32 t; lop3.b32 t, $2, $3, $4, 0xEA; sub.f16x2 t, t, $5; mov.b32 {$0, $1}, t; }",
                "=h,=h,r,r,r,r", [x, mask, bias, zb2], dtype=(gl.float16, gl.float16), is_pure=True, pack=1)  # fmt: skip
        else:
            lo, hi = gl.inline_asm_elementwise(
                "{ .reg .b32 t; lop3.b32 t, $2, $3, $4, 0xEA; sub.bf16x2 t, t, $5; mov.b32 {$0, $1}, t; }",
                "=h,=h,r,r,r,r", [x, mask, bias, zb2], dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=1)  # fmt: skip
        return gl.join(lo, hi)

    @gluon.jit
    def _pair_fp4(words, P: gl.constexpr, mag, sign, s2):
        """Nibbles P and P + 4 of each word, e2m1 codes, as bf16 (value x scale x 2**-63), [..., 2]: the
        magnitude bits go to bf16 bits 6..8 (22..24), the sign to 15 (31): the bf16x2 of value x 2**-126
        (codes 0.5 land on the subnormal 2**-127, exactly), then one packed multiply by the thread's
        2**(e - 64) = scale x 2**63 (the activations carry the 2**63 the weight lacks)."""
        if P == 0:
            m_src = words << 6
        elif P == 1:
            m_src = words << 2
        else:
            m_src = words >> (4 * P - 6)
        s_src = words if P == 3 else words << (12 - 4 * P)
        lo, hi = gl.inline_asm_elementwise(
            "{ .reg .b32 t; and.b32 t, $2, $4; lop3.b32 t, $3, $5, t, 0xEA; mul.rn.bf16x2 t, t, $6; "
            "mov.b32 {$0, $1}, t; }", "=h,=h,r,r,r,r,r", [m_src, s_src, mag, sign, s2],
            dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=1)  # fmt: skip
        return gl.join(lo, hi)

    @gluon.jit
    def _decode(words, m0, m1, s2, zs2, BLOCK_N: gl.constexpr, DT: gl.constexpr, LA: gl.constexpr, FP4: gl.constexpr,
                SCALE_AFTER: gl.constexpr = False):  # fmt: skip
        """[BLOCK_N, 4, 4] words -> the [BLOCK_N, 128] A operand in layout LA. Logical column
        k' = 16 c + 8 h + 2 t + e (c = 2 u + c1) holds physical column 32 t + 8 u + 4 e + 2 c1 + h.
        m0, m1: the format's masks (int4: INT4_PAIR_MASK and the bias; MXFP4: FP4_MASKS). SCALE_AFTER
        (int4): q - z unscaled, zs2 then the pair (128 + z, 128 + z)."""
        if SCALE_AFTER:
            h0 = gl.join(_pair_int4_unscaled(words, 0, m0, m1, zs2, DT), _pair_int4_unscaled(words, 1, m0, m1, zs2, DT))
            h1 = gl.join(_pair_int4_unscaled(words, 2, m0, m1, zs2, DT), _pair_int4_unscaled(words, 3, m0, m1, zs2, DT))
        elif FP4:
            h0 = gl.join(_pair_fp4(words, 0, m0, m1, s2), _pair_fp4(words, 1, m0, m1, s2))
            h1 = gl.join(_pair_fp4(words, 2, m0, m1, s2), _pair_fp4(words, 3, m0, m1, s2))
        else:
            h0 = gl.join(_pair_int4(words, 0, m0, m1, s2, zs2, DT), _pair_int4(words, 1, m0, m1, s2, zs2, DT))
            h1 = gl.join(_pair_int4(words, 2, m0, m1, s2, zs2, DT), _pair_int4(words, 3, m0, m1, s2, zs2, DT))
        x = gl.join(h0, h1)  # [BLOCK_N, 4 (t), 4 (u), 2 (e), 2 (h), 2 (c1)]
        x = gl.permute(x, [0, 2, 5, 4, 1, 3])  # [n, u, c1, h, t, e]
        return gl.convert_layout(gl.reshape(x, [BLOCK_N, 128]), LA)

    @gluon.jit
    def a_operand_order(x, BLOCK_M: gl.constexpr, FP4: gl.constexpr):
        """The [BLOCK_M, 128] activation tile of a K step with its columns in the order _decode gives the
        weight's (MXFP4: x 2**63, the scale the decoded weight lacks)."""
        if FP4:
            x = (x.to(gl.float32) * 9223372036854775808.0).to(x.dtype)  # 2**63, exact
        x = gl.reshape(x, [BLOCK_M, 4, 4, 2, 2, 2])  # physical column 32 t + 8 u + 4 e + 2 c1 + h
        return gl.reshape(gl.permute(x, [0, 2, 4, 5, 1, 3]), [BLOCK_M, 128])  # [m, u, c1, h, t, e]

    @gluon.jit
    def e8m0_bf16(e):
        """The bf16 bits of 2**(e - 64) for e8m0 scale bytes e (the decoded MXFP4 weight is value x 2**-63)."""
        return (e.to(gl.int32) + 63) << 7

    @gluon.jit
    def _load_words(w_ptrs, s_ptrs, z_ptrs, kw, stride_sk, GROUP_K: gl.constexpr, FP4: gl.constexpr):
        """The K step at word kw: words [BLOCK_N, 4, 4], scales and zero points [BLOCK_N, 4] (a row's and
        quad lane's; MXFP4: the scales twice)."""
        g = kw // (GROUP_K // 8) * stride_sk
        s = gl.load(s_ptrs + g)
        z = s if FP4 else gl.load(z_ptrs + g)
        return gl.load(w_ptrs + kw), s, z

    @gluon.jit
    def _load_x(a_ptrs, rows_in, kw, BLOCK_M: gl.constexpr, FP4: gl.constexpr):
        """The K step's [BLOCK_M, 128] activation tile with its columns in the A operand's order (MXFP4: x 2**63)."""
        return a_operand_order(gl.load(a_ptrs + kw * 8, mask=rows_in, other=0.0), BLOCK_M, FP4)

    @gluon.jit
    def _load_step(w_ptrs, s_ptrs, z_ptrs, a_ptrs, rows_in, kw, stride_sk, GROUP_K: gl.constexpr,
                   BLOCK_M: gl.constexpr, FP4: gl.constexpr):  # fmt: skip
        """The K step at word kw: _load_words' words, scales and zero points, and _load_x's activation tile
        (issued in this order, the order the timed default plans were compiled in)."""
        g = kw // (GROUP_K // 8) * stride_sk
        x = _load_x(a_ptrs, rows_in, kw, BLOCK_M, FP4)
        s = gl.load(s_ptrs + g)
        z = s if FP4 else gl.load(z_ptrs + g)
        return gl.load(w_ptrs + kw), s, z, x

    @gluon.jit
    def _step_scale_after(words, z, s_acc, x_buf, acc, mask, bias, BLOCK_N: gl.constexpr, DT: gl.constexpr,
                          LA: gl.constexpr):  # fmt: skip
        """One K step of one group of 128 (int4): decode q - z exactly (the scale left out), the MMA into a
        fresh accumulator, then acc += s x that product in float32 (s_acc: the rows' scales in the
        accumulator's row layout). One packed FMA a weight pair fewer than _step, and the product is
        scaled in float32 rather than the weight rounded to 16 bits after scaling."""
        zb = (z.to(gl.float32) + (1024.0 if DT == gl.float16 else 128.0)).to(DT)
        zb2 = zb.to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
        a_op = _decode(words, mask, bias, zb2, gl.expand_dims(zb2 | (zb2 << 16), 2), BLOCK_N, DT, LA, False, True)
        step = warpgroup_mma(a_op, x_buf.permute((1, 0)), acc, use_acc=False)
        return acc + gl.expand_dims(s_acc.to(gl.float32), 1) * step

    @gluon.jit
    def _step(words, s, z, x_buf, acc, mask, bias, BLOCK_N: gl.constexpr, DT: gl.constexpr, LA: gl.constexpr,
              FP4: gl.constexpr):  # fmt: skip
        """One K step into the accumulator: decode the words with the thread's (s, s) and (-z s, -z s)
        (MXFP4: (2**(e - 64), ...)) as 16-bit pairs in a word, then the MMA with the activation tile in
        shared memory."""
        a_op = _step_operand(words, s, z, mask, bias, BLOCK_N, DT, LA, FP4)
        return warpgroup_mma(a_op, x_buf.permute((1, 0)), acc)

    @gluon.jit
    def _step_operand(words, s, z, mask, bias, BLOCK_N: gl.constexpr, DT: gl.constexpr, LA: gl.constexpr,
                      FP4: gl.constexpr):  # fmt: skip
        """_step's decode: the K step's [BLOCK_N, 128] A operand."""
        if FP4:
            s2 = e8m0_bf16(s)
            zs2 = s2  # no zero points
        else:
            sd = s.to(DT)
            s2 = sd.to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
            zs2 = (-(z.to(DT) * sd)).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
        return _decode(words, mask, bias, gl.expand_dims(s2 | (s2 << 16), 2), gl.expand_dims(zs2 | (zs2 << 16), 2),
                       BLOCK_N, DT, LA, FP4)  # fmt: skip

    @gluon.jit
    def w4_gemm_sm90_kernel(
        a_ptr, w_ptr, c_ptr, bias_ptr, s_ptr, z_ptr, ws_ptr, cnt_ptr,
        M, N, K, KW_PER_SPLIT, stride_am, stride_wn, stride_cm, stride_sn, stride_sk, mask, bias,
        GROUP_K: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, FP16: gl.constexpr, FP4: gl.constexpr,
        HAS_BIAS: gl.constexpr, SPLIT_K: gl.constexpr, PREFETCH: gl.constexpr, SCALE_AFTER: gl.constexpr = False,
        X_AHEAD: gl.constexpr = True, M_TILED: gl.constexpr = False, ASYNC_MMA: gl.constexpr = False,
        PDL: gl.constexpr = False,
    ):  # fmt: skip
        """c[m, n] = sum_k a[m, k] w[n, k] (+ bias[n]) for BLOCK_N weight rows and all M (<= BLOCK_M)
        activation rows a program, over the K range of its split (program_id 1). M_TILED (one split): M
        beyond BLOCK_M, program_id 0 = weight tile x row blocks + row block."""
        gluon_pdl_wait(PDL)
        WARPS: gl.constexpr = gl.num_warps()  # 4, 8 or 16: one to four warpgroups, 64 rows each a pass
        DT: gl.constexpr = gl.float16 if FP16 else gl.bfloat16
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, BLOCK_M, 16])  # fmt: skip
        LA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
        LW: gl.constexpr = _words_layout(BLOCK_N, WARPS)
        LX: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])  # activations, 16-byte loads
        SX: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

        pid_n = gl.program_id(0)
        if M_TILED:  # the row blocks of a weight tile adjacent (its words from L2 after the first)
            blocks = gl.cdiv(M, BLOCK_M)
            row0 = pid_n % blocks * BLOCK_M
            pid_n = pid_n // blocks
            a_ptr += row0.to(gl.int64) * stride_am
            c_ptr += row0.to(gl.int64) * stride_cm
            M = gl.minimum(M - row0, BLOCK_M)
        # in words (8 columns); KW_PER_SPLIT a multiple of 16 (one K step), so are the loop's offsets
        kw_start = gl.program_id(1) * KW_PER_SPLIT
        kw_end = gl.minimum(K // 8, kw_start + KW_PER_SPLIT)
        # words: w_ptr + n * stride_wn + (k / 8 + 4 t + u)
        L2: gl.constexpr = gl.SliceLayout(2, LW)  # [BLOCK_N, 4]: per row and quad lane (scales, zero points)
        nw = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, L2))
        nw = gl.where(nw < N, nw, 0).to(gl.int64)
        tw = gl.arange(0, 4, layout=gl.SliceLayout(0, L2))
        uw = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LW)))
        w_ptrs = w_ptr + (gl.expand_dims(gl.expand_dims(nw * stride_wn, 1) + gl.expand_dims(tw * 4, 0), 2)
                          + gl.expand_dims(gl.expand_dims(uw, 0), 1))  # fmt: skip
        # scales, zero points of columns 32 t .. 32 t + 31 of the K step
        s_off = gl.expand_dims(nw * stride_sn, 1) + gl.expand_dims(tw * 32 // GROUP_K * stride_sk, 0)
        # activations: a_ptr + m * stride_am + k + column
        mx = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LX))
        kx = gl.arange(0, 128, layout=gl.SliceLayout(0, LX))
        rows_in = gl.expand_dims(mx < M, 1)
        a_ptrs = a_ptr + gl.expand_dims(mx.to(gl.int64) * stride_am, 1) + gl.expand_dims(kx, 0)

        # two activation buffers: a step writes one while no thread can still be reading it (the MMA two
        # steps back finished before its thread reached the last step's barrier), one barrier a step
        # ASYNC_MMA: two K steps an iteration, the second's decode under the first's MMA (asynchronous) and both
        # retired before the back edge (an MMA in flight across it makes ptxas serialize every MMA: C7514). A
        # warpgroup may then store step j's tile while the other's MMAs of steps j - 1 and j - 2 still read
        # theirs: three buffers
        NBUF: gl.constexpr = 3 if ASYNC_MMA else 2
        x_smem = gl.allocate_shared_memory(DT, [NBUF, BLOCK_M, 128], SX)
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ACC)
        s_ptrs = s_ptr + s_off
        z_ptrs = z_ptr + s_off
        if X_AHEAD or PREFETCH == 0:
            words, s, z, x = _load_step(w_ptrs, s_ptrs, z_ptrs, a_ptrs, rows_in, kw_start, stride_sk, GROUP_K, BLOCK_M,
                                        FP4)  # fmt: skip
        else:  # the activation tile is loaded at its own step
            words, s, z = _load_words(w_ptrs, s_ptrs, z_ptrs, kw_start, stride_sk, GROUP_K, FP4)
        if SCALE_AFTER:  # the rows' scales in the accumulator's row layout (a K step is one group of 128)
            na = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))
            s_acc_ptrs = s_ptr + gl.where(na < N, na, 0).to(gl.int64) * stride_sn
            s_acc = gl.load(s_acc_ptrs + kw_start // 16 * stride_sk)
        if PREFETCH == 2:  # the step after the first's words (the last steps reload the last)
            w1, s1, z1 = _load_words(w_ptrs, s_ptrs, z_ptrs, gl.minimum(kw_start + 16, kw_end - 16), stride_sk,
                                     GROUP_K, FP4)  # fmt: skip
        buf = 0
        STEPS: gl.constexpr = 2 if ASYNC_MMA else 1  # K steps an iteration
        for kw0 in range(kw_start, kw_end, 16 * STEPS):
            for u in gl.static_range(STEPS):
                kw = kw0 + 16 * u
                if PREFETCH != 0:  # the next step's loads in flight during this one's decode and MMA (words PREFETCH
                    # steps ahead; the last steps reload the last)
                    nxt = gl.minimum(kw + 16, kw_end - 16)
                    if X_AHEAD and PREFETCH == 1:
                        n_words, n_s, n_z, n_x = _load_step(w_ptrs, s_ptrs, z_ptrs, a_ptrs, rows_in, nxt, stride_sk,
                                                            GROUP_K, BLOCK_M, FP4)  # fmt: skip
                    else:
                        n_words, n_s, n_z = _load_words(w_ptrs, s_ptrs, z_ptrs, gl.minimum(kw + 16 * PREFETCH, kw_end - 16),
                                                        stride_sk, GROUP_K, FP4)  # fmt: skip
                        if X_AHEAD:
                            n_x = _load_x(a_ptrs, rows_in, nxt, BLOCK_M, FP4)
                    if SCALE_AFTER:
                        n_s_acc = gl.load(s_acc_ptrs + nxt // 16 * stride_sk)
                    if not X_AHEAD:
                        x = _load_x(a_ptrs, rows_in, kw, BLOCK_M, FP4)
                else:
                    words, s, z, x = _load_step(w_ptrs, s_ptrs, z_ptrs, a_ptrs, rows_in, kw, stride_sk, GROUP_K, BLOCK_M,
                                                FP4)  # fmt: skip
                    if SCALE_AFTER:
                        s_acc = gl.load(s_acc_ptrs + kw // 16 * stride_sk)
                x_buf = x_smem.index(buf)
                x_buf.store(x)
                fence_async_shared()
                gluon_barrier()
                if SCALE_AFTER:
                    acc = _step_scale_after(words, z, s_acc, x_buf, acc, mask, bias, BLOCK_N, DT, LA)
                elif ASYNC_MMA:
                    a_op = _step_operand(words, s, z, mask, bias, BLOCK_N, DT, LA, FP4)
                    acc = warpgroup_mma(a_op, x_buf.permute((1, 0)), acc, is_async=True)
                    if u == 0:
                        a_first = a_op
                    else:  # both MMAs retired, their operands held until then
                        acc, a_first, a_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a_first, a_op))
                else:
                    acc = _step(words, s, z, x_buf, acc, mask, bias, BLOCK_N, DT, LA, FP4)
                if PREFETCH != 0:
                    if PREFETCH == 2:
                        words, s, z = w1, s1, z1
                        w1, s1, z1 = n_words, n_s, n_z
                    else:
                        words, s, z = n_words, n_s, n_z
                    if X_AHEAD:
                        x = n_x
                    if SCALE_AFTER:
                        s_acc = n_s_acc
                if ASYNC_MMA:
                    buf = (buf + 1) % NBUF
                else:
                    buf = 1 - buf

        splitk_sm90.finish_tile(acc, c_ptr, bias_ptr, c_ptr, c_ptr, ws_ptr, cnt_ptr, pid_n, gl.program_id(1), M, N,
                                stride_cm, 0, BLOCK_N, BLOCK_M, ACC, HAS_BIAS, 0, 0, SPLIT_K)  # fmt: skip
