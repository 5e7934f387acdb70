"""The 4-bit GEMV at M = 1 for NVIDIA Hopper, written in Gluon; the portable Triton kernel
(gemv_w4.py) serves every other GPU, M above 1, and shapes this one does not take.

Why a second kernel: at M = 1 the word GEMV is bound by instruction issue as much as by HBM, and
most of the portable kernel's instructions are not the decode but the moves between the layouts
Triton picks for the weight words, the activation tile and the per-group sums (5.2 instructions a
weight for int4 on sm90: scripts/sass_loop_mix.py, experiments/quant4/README.md). Here the layouts
are chosen by hand so that nothing moves between threads inside the K loop:

- the packed weight is read as it is stored (int32 words of eight nibbles, nibble j of word w is
  column 8 w + j) in a [BLOCK_N, GPI, WPG] tile: GPI scale groups of WPG words. A thread holds ROWS
  rows x WPT contiguous words of one group (one 16-byte load each), a warp covers 32 x WPT / WPG
  groups x WPG words of a row;
- the activation is loaded [GPI, WPG, 8] in the slice of the same 4-d layout: each thread's
  WPT x 8 contiguous activations are exactly the columns its words meet (16-byte loads, no
  conversion), the eight nibble columns are the in-thread last dim;
- int4 takes five shifts a word (nibbles decoded in place at float bits 12..15 or 16..19 to 1 + q 2**-11
  or 1 + q 2**-7, their activations scaled by 2**11 or 2**7 once a tile), MXFP4 gemv_w4's 2**-126 e2m1
  bits, a nibble pair (j, j + 4) at a time (gemv_w4._pair_fp4), bf16 activations scaled by 2**100 in
  their exponent bits; the decode's masks are kernel arguments, so that they stay in registers;
- products are chained per word column (FMA) over the eight nibbles, scaled per group into a
  per-word-column accumulator (int4: the zero points' and the decode bias's terms per group beside
  it), and summed across threads once, after the loop. TILINGS holds the H200's rows a thread, warps
  along K or rows, and next-tile prefetch per format (the tile past K, when K is whole tiles, is the
  last one again: unmasked loads);
- HALF2 (gemv_w4.FP4_HALF2): nibble pairs into fp16x2 and packed FMAs, each thread's run of four words of
  a group and a row chained in fp16, then summed in float32 and scaled per group (int4: minus its zero
  point times the run's activations).

Each program covers all of K (Tiling.split, opt-in and timed slower, cuts long rows into runs); the bias is added
in the store.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from tritonllm.kernels import gemv_w4, splitk_sm90
from tritonllm.kernels.launch import compile_gluon_sm90, gluon_pdl_wait, gluon_sm90_available
from tritonllm.kernels.moe_epilogue import moe_activation

try:  # recent triton ships Gluon; without it the portable kernel serves every GEMV
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older triton
    HAVE_GLUON = False

NUM_WARPS = 4
WPT = 4  # contiguous words a thread holds of a scale group: one 16-byte load


def half2_on() -> bool:
    """Whether 4-bit weights take the fp16x2 decode and packed FMAs (gemv_w4.FP4_BITS, NVIDIA's default)."""
    return gemv_w4.FP4_BITS == gemv_w4.FP4_HALF2


@dataclass(frozen=True)
class Tiling:
    rows: int = 8  # weight rows a thread: the activations' conversion and sums are shared by them
    warps_k: int = 4  # of a program's NUM_WARPS warps, those that take further K groups (the others take rows)
    prefetch: bool = False  # issue the next K tile's loads before this tile's arithmetic
    maxnreg: int | None = None  # a register cap for ptxas (more programs an SM, perhaps spills)
    # row blocks a program where K fits one K tile and N is whole blocks (w4_gemv_sm90_blocks_kernel: the next
    # block's weights in flight while this one is summed; the activations and their factor once a program)
    blocks: int = 1
    # K splits where K is longer than one K tile: each row block's K cut into up to SPLIT runs of whole K tiles, one
    # program a run, their float32 partials summed by the last to arrive (splitk_sm90.finish_part): more programs
    # and shorter chains of dependent loads for long rows (Llama-3-8B's down: 512 programs of 3.5 tiles at 8 rows)
    split: int = 1

    @property
    def block_n(self) -> int:
        """Weight rows a program: ROWS a thread on each of the warps that take rows (NUM_WARPS / WARPS_K)."""
        return self.rows * NUM_WARPS // self.warps_k

    @classmethod
    def parse(cls, text: str) -> Tiling:
        """ "ROWS:WARPS_K:PREFETCH:MAXNREG[:BLOCKS[:SPLIT]]" (MAXNREG 0: no cap)."""
        rows, warps_k, prefetch, maxnreg, *rest = (int(v) for v in text.split(":"))
        return cls(rows, warps_k, bool(prefetch), maxnreg or None, *rest)

    def spec(self) -> str:
        """The parse form (BLOCKS and SPLIT where not 1)."""
        text = f"{self.rows}:{self.warps_k}:{int(self.prefetch)}:{self.maxnreg or 0}"
        if self.blocks > 1 or self.split > 1:
            text += f":{self.blocks}"
        return text + (f":{self.split}" if self.split > 1 else "")


# per format ("int4", "fp4"); TRITONLLM_W4_GEMV_SM90_TILING="int4=R:W:P:M,fp4=R:W:P:M" overrides (sweeps).
# The H200's, Llama-3-8B shapes, L2 cold: in half pairs (half2_on, the default) both formats at 8 rows a thread,
# warps along K (session 36, experiments/quant4/h200_session36/: int4 qkv 7.4, o 5.7, gate_up 22.0, down 16.3 us;
# MXFP4 7.6, 6.1, 22.3, 14.2); in float32 (session 12, gemv_sm90/h200_session12/sweep_tilings.json) int4 at 4
# rows, warps along rows, next tile prefetched (qkv 7.4, o 5.8, gate_up 28.5, down 14.3 us at the time), MXFP4 8:4:0
# "int4_long": int4 at K above LONG_K in half pairs, 16 rows a thread (down 15.1 against 16.3 us at 8:4:0; qkv, o and
# gate_up slower at 16 rows: 8.5, 6.0, 24.8 us); a format set from the environment drops its long-K entry
TILINGS = {
    "int4": Tiling(rows=8, warps_k=4) if half2_on() else Tiling(rows=4, warps_k=1, prefetch=True),
    "fp4": Tiling(rows=8, warps_k=4, prefetch=False),
}
if half2_on():
    TILINGS["int4_long"] = Tiling(rows=16, warps_k=4)
for _fmt, _spec in (item.split("=") for item in os.environ.get("TRITONLLM_W4_GEMV_SM90_TILING", "").split(",") if item):
    TILINGS[_fmt] = Tiling.parse(_spec)
    TILINGS.pop(f"{_fmt}_long", None)
LONG_K = 8192


def tiling_for(fp4: bool, k: int) -> Tiling:
    """The tiling TILINGS gives a GEMV of inner size k."""
    fmt = "fp4" if fp4 else "int4"
    return TILINGS.get(f"{fmt}_long", TILINGS[fmt]) if k > LONG_K else TILINGS[fmt]


# whether a HALF2 program whose first K tile holds the whole row takes the row's largest |a| from that tile instead of
# a pass over the row (_row_exp; TRITONLLM_W4_ROW_EXP_TILE=0: the pass, for A/B runs)
ROW_EXP_TILE = os.environ.get("TRITONLLM_W4_ROW_EXP_TILE", "1") == "1"
FP4_OUT_SCALE = 2.0**26  # as gemv_w4: the activations' 2**100 (gemv_w4._act_scaled) and the decode's 2**-126 undone
# the decode's bit masks, passed as kernel arguments so that the compiler keeps them in registers (as
# literals, ptxas re-materialises one before every LOP3: ~0.6 instructions a weight)
FP4_MASKS = gemv_w4.FP4_PAIR_MASKS  # a nibble pair's e2m1 magnitudes at bits 6..8 / 22..24, signs at 15 / 31
INT4_MASKS = (0x0000F000, 0x000F0000)  # a nibble at float bits 12..15, 16..19


def tile_k(tiling: Tiling) -> int:
    """Columns a program's K loop takes an iteration: WARPS_K warps x 32 threads x WPT words, 8 nibbles each."""
    return tiling.warps_k * 32 * WPT * 8


def supported(m: int, k: int, group_k: int) -> bool:
    """Whether this kernel takes the shape: one activation row, scale groups of 32, 64 or 128 columns
    (an MXFP4 group is 32), K whole groups."""
    return HAVE_GLUON and m == 1 and group_k in (32, 64, 128) and k % group_k == 0


def measured_faster(n: int, k: int, fp4: bool) -> bool:
    """Where this kernel (at TILINGS) measured faster than the portable one at Llama-3-8B shapes: every shape.
    int4 on the H200 (experiments/quant4/README.md, session 12: qkv 7.4 / 8.3 us, o 5.8 / 6.8, gate_up 28.5 /
    31.9, down 14.3 / 17.7). MXFP4 took K <= 4096 only until its nibbles were decoded in pairs (session 31, an
    H100, cold L2: down 4096 x 14336 18.0 us against the portable GEMV's 18.6 on the H200 in session 12 and
    the H100's default tile kernel's 68.0; qkv 9.7, o 7.3, gate_up 29.4 us, all 2.2-2.8x bf16 cuBLAS)."""
    return True


def takes(a: torch.Tensor, k: int, group_k: int) -> bool:
    """Whether gemm() can run this kernel for a [1, K] activation (and a packed 4-bit weight that reads
    as words, gemv_w4.as_words, checked by the caller): the shape supported, the activation read as the
    kernel reads it, an sm90 GPU."""
    return (
        supported(a.shape[0], k, group_k) and a.stride(1) == 1 and a.dtype in (torch.bfloat16, torch.float16)
        and available()
    )  # fmt: skip


def unavailable() -> str | None:
    """The linear implementation's availability check (registry.Supports.available)."""
    return None if available() else "needs an NVIDIA sm90 GPU and a Triton whose Gluon compiles the W4 GEMV"


@functools.cache
def available() -> bool:
    """Whether this machine runs the kernel: an NVIDIA sm90 GPU and a Triton whose Gluon compiles it
    (Gluon's API is experimental: a version that breaks it leaves every GEMV to the portable kernel,
    with a warning, instead of failing a step)."""
    return gluon_sm90_available(
        HAVE_GLUON,
        "W4 GEMV",
        "the portable Triton kernel serves 4-bit GEMVs instead",
        lambda: compile_sm90(fp4=False),
        lambda: compile_sm90(fp4=True),
    )


def compile_sm90(fp4: bool, group_k: int | None = None, tiling: Tiling | None = None, even: bool = True,
                 half2: bool = False, one_tile: bool = False, gated: bool = False):  # fmt: skip
    """Compile the kernel for sm90 without a GPU (Triton's own compiler and ptxas); returns the
    compiled kernel (its .asm holds the IR, PTX and cubin). For tests, scripts/sass_loop_mix.py and
    the probe of available(). half2: the FP4_HALF2 build (gemv_w4: packed half-precision products); a tiling of
    several blocks: w4_gemv_sm90_blocks_kernel; a tiling's split: the SPLIT_K build (K in runs; even: every run
    whole K tiles); gated: the GATED build (silu(gate) * up in the epilogue)."""
    tiling = tiling or TILINGS["fp4" if fp4 else "int4"]
    constexprs = dict(FP4=fp4, GROUP_K=group_k or (32 if fp4 else 128), ROWS=tiling.rows, WARPS_K=tiling.warps_k,
                      EVEN=even, HAS_BIAS=False, PDL=True, HALF2=half2)  # fmt: skip
    kernel = w4_gemv_sm90_kernel
    if tiling.blocks > 1:  # the blocked kernel (K within one tile)
        kernel = w4_gemv_sm90_blocks_kernel
        constexprs.update(BLOCKS=tiling.blocks)
    else:
        constexprs.update(PREFETCH=tiling.prefetch, ONE_TILE=one_tile, GATED=gated, SPLIT_K=tiling.split)
    scale = "*u8" if fp4 else "*bf16"
    types = dict(a_ptr="*bf16", w_ptr="*i32", c_ptr="*bf16", bias_ptr="*bf16", s_ptr=scale, z_ptr=scale,
                 ws_ptr="*fp32", cnt_ptr="*i32")  # fmt: skip
    return compile_gluon_sm90(kernel, constexprs, types,
                              ("a_ptr", "w_ptr", "s_ptr", "z_ptr", "K", "stride_wn"), num_warps=NUM_WARPS,
                              **({"maxnreg": tiling.maxnreg} if tiling.maxnreg else {}))  # fmt: skip


def w4_gemv_sm90(a: torch.Tensor, words: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None,
                 scale: torch.Tensor, zero: torch.Tensor | None, group_k: int, fp4: bool, pdl: dict,
                 gated: bool = False) -> torch.Tensor:  # fmt: skip
    """c[0] = a[0] . w^T (+ bias) for the int32 word view [N, K / 8] of the packed weight, its scales
    [N, K / group_k] (and int4 zero points, None for MXFP4); a [1, K] with unit column stride. gated: the weight is
    a gated MLP's [gate | up] (N even) and c[0] [N / 2] = silu(gate) * up of the two halves' sums."""
    n, k = words.shape[0] // (2 if gated else 1), a.shape[1]
    t = tiling_for(fp4, k)
    half2 = half2_on()
    if half2:
        masks = gemv_w4.HALF2_MASKS if fp4 else gemv_w4.INT4_HALF2_MASKS
    else:
        masks = FP4_MASKS if fp4 else INT4_MASKS
    block_n = t.block_n
    if gated and block_n % 2:
        raise ValueError(f"the gated W4 GEMV pairs gate and up rows: a tiling of {block_n} rows a program is odd")
    one_tile = k <= tile_k(t)
    args = (a, words, c, bias if bias is not None else c, scale, zero if zero is not None else scale,
            n, k, words.stride(0), scale.stride(0), scale.stride(1), *masks)  # fmt: skip
    common = dict(FP4=fp4, GROUP_K=group_k, ROWS=t.rows, WARPS_K=t.warps_k, EVEN=k % tile_k(t) == 0,
                  HAS_BIAS=bias is not None, HALF2=half2, num_warps=NUM_WARPS,
                  **({"maxnreg": t.maxnreg} if t.maxnreg else {}), **pdl)  # fmt: skip
    if t.blocks > 1 and one_tile and n % block_n == 0 and not gated:
        w4_gemv_sm90_blocks_kernel[(-(-n // (block_n * t.blocks)),)](*args, BLOCKS=t.blocks, **common)
        return c
    split, k_split, ws, counters = 1, k, c, c
    if t.split > 1 and not one_tile and not gated:  # K split into runs of whole K tiles (Tiling.split)
        split, k_split, _, ws, counters = splitk_sm90.plan_splits(1, n, k, t.split, tile_k(t), block_n, c)
    if split > 1:  # (EVEN as before: the runs are whole tiles but the last, which ends where K does)
        one_tile = k_split <= tile_k(t)
    one_tile = half2 and ROW_EXP_TILE and one_tile  # the row's (run's) factor from its one tile
    grid = (-(-n // (block_n // 2 if gated else block_n)), split)
    w4_gemv_sm90_kernel[grid](*args, ws, counters, k_split, PREFETCH=t.prefetch, ONE_TILE=one_tile, GATED=gated,
                              SPLIT_K=split, **common)  # fmt: skip
    return c


if HAVE_GLUON:
    _WARPS = gl.constexpr(NUM_WARPS)
    _OUT_SCALE = gl.constexpr(FP4_OUT_SCALE)

    _WPT = gl.constexpr(WPT)

    @gluon.constexpr_function
    def _layout(rows, wpg, wpt, warps_k):
        """[ROWS x NUM_WARPS / WARPS_K, GPI, WPG, 8]: a thread holds ROWS rows x WPT words x 8 nibbles of
        one group; a warp's lanes cover the WPG / WPT word runs of a group, then 32 / (WPG / WPT) groups
        of its rows; WARPS_K warps take further groups (K), the others further rows."""
        tw = wpg // wpt
        return gl.BlockedLayout(
            [rows, 1, wpt, 8], [1, 32 // tw, tw, 1], [NUM_WARPS // warps_k, warps_k, 1, 1], [3, 2, 1, 0]
        )

    _activation = gluon.jit(moe_activation.fn)  # elementwise: the Triton epilogue's, as it is
    _fp4_pair = gluon.jit(gemv_w4._pair_fp4.fn)  # nibbles j, j + 4 -> two float32 (masks: FP4_MASKS, in registers)
    _act_scaled = gluon.jit(gemv_w4._act_scaled.fn)  # bf16 activations x 2**100 through their exponent bits
    # FP4_HALF2 (gemv_w4): nibble pairs as fp16x2 (masks HALF2_MASKS, in registers), chained by packed FMAs
    _fp16_pairs = gluon.jit(gemv_w4._fp16_pairs.fn)
    _half2_scales = gluon.jit(gemv_w4.half2_scales.fn)  # the row's activation and output factors
    _HALF2_MIN_EXP = gl.constexpr(gemv_w4.HALF2_MIN_EXP.value)
    _INT4_HALF2_SCALE = gl.constexpr(gemv_w4.INT4_HALF2_SCALE.value)
    _INT4_ODD_SCALE = gl.constexpr(gemv_w4.INT4_ODD_SCALE.value)
    _ROW_EXP_LOADS = gl.constexpr(gemv_w4.ROW_EXP_LOADS.value)
    _half = gluon.jit(gemv_w4._half.fn)  # an fp16x2's low or high half as float32

    # gemv_w4's PTX packed FMA and float32 -> fp16x2 conversion (called with ASM True: Gluon is NVIDIA's)
    _hfma2 = gluon.jit(gemv_w4._hfma2.fn)
    _pack_half2 = gluon.jit(gemv_w4._pack_half2.fn)

    @gluon.jit
    def _row_exp(a_ptr, K):
        """gemv_w4.half2_row_exp for the activation row a_ptr[0, K): the float32 exponent field of its largest
        |a|, at least gemv_w4.HALF2_MIN_EXP (a scalar); gemv_w4.ROW_EXP_LOADS chunks of 1,024 in flight at once."""
        L1: gl.constexpr = gl.BlockedLayout([8], [32], [_WARPS], [0])
        CHUNK: gl.constexpr = 8 * 32 * _WARPS
        offs = gl.arange(0, CHUNK, layout=L1)
        m = gl.zeros([CHUNK], gl.float32, layout=L1)
        for k in range(0, K, _ROW_EXP_LOADS * CHUNK):
            for i in gl.static_range(_ROW_EXP_LOADS):
                a = gl.load(a_ptr + (k + i * CHUNK) + offs, mask=(k + i * CHUNK) + offs < K, other=0.0)
                m = gl.maximum(m, gl.abs(a.to(gl.float32)))
        return _exp_field(gl.max(m, axis=0))

    @gluon.jit
    def _exp_field(amax):
        """The float32 exponent field of amax >= 0, at least gemv_w4.HALF2_MIN_EXP."""
        return gl.maximum(amax.to(gl.int32, bitcast=True) >> 23, _HALF2_MIN_EXP)

    @gluon.constexpr_function
    def _runs_layout(rows, wpg, wpt, warps_k):
        """[ROWS x NUM_WARPS / WARPS_K, GPI, WPG / WPT]: _layout's words with each thread's run of WPT words
        one element (HALF2's per-run sums: the same registers and lanes)."""
        tw = wpg // wpt
        return gl.BlockedLayout([rows, 1, 1], [1, 32 // tw, tw], [NUM_WARPS // warps_k, warps_k, 1], [2, 1, 0])

    _chain4 = gluon.jit(gemv_w4._pairs_dot_half2.fn)  # a word's four pairs into acc (masks: in registers)

    @gluon.jit
    def _four(x):
        """[..., 4] (in-thread) -> its four [...] slices, in order."""
        e, o = gl.split(gl.reshape(x, x.shape[:-1] + [2, 2]))  # index 2i + j: j, then i
        x0, x2 = gl.split(e)
        x1, x3 = gl.split(o)
        return x0, x1, x2, x3

    @gluon.jit
    def _runs(x):
        """[..., WPG] (runs of WPT = 4 words in-thread) -> the four [..., WPG / 4] word slices of the runs."""
        return _four(gl.reshape(x, x.shape[:-1] + [x.shape[-1] // _WPT, _WPT]))

    @gluon.jit
    def _runs_half2(words, a0, a1, a2, a3, a4, a5, a6, a7, m0, m1, FP4: gl.constexpr, LR: gl.constexpr):
        """Each thread's run of WPT = 4 words of a group and a row: the sum of its products w a' (MXFP4 w x 2**-14,
        int4 q x 2**-24 or 2**-20: gemv_w4's pair decodes), as float32 [BLOCK_N, GPI, WPG / 4] in LR: its 16 packed
        FMAs chained in fp16, then the two halves summed; a_j [GPI, WPG] the activations' columns, scaled into
        fp16's range (int4's odd columns by INT4_ODD_SCALE too)."""
        w0, w1, w2, w3 = _runs(words)
        p00, p01, p02, p03 = _runs(_pack_half2(a0, a4, True))  # pair 0 of a run's words 0..3
        p10, p11, p12, p13 = _runs(_pack_half2(a1, a5, True))
        p20, p21, p22, p23 = _runs(_pack_half2(a2, a6, True))
        p30, p31, p32, p33 = _runs(_pack_half2(a3, a7, True))
        w0 = gl.convert_layout(w0, LR)  # the same registers
        w1 = gl.convert_layout(w1, LR)
        w2 = gl.convert_layout(w2, LR)
        w3 = gl.convert_layout(w3, LR)
        LP: gl.constexpr = gl.SliceLayout(0, LR)
        acc = _chain4(
            w0, _row(p00, LP), _row(p10, LP), _row(p20, LP), _row(p30, LP), gl.zeros_like(w0), FP4, True, m0, m1
        )
        acc = _chain4(w1, _row(p01, LP), _row(p11, LP), _row(p21, LP), _row(p31, LP), acc, FP4, True, m0, m1)
        acc = _chain4(w2, _row(p02, LP), _row(p12, LP), _row(p22, LP), _row(p32, LP), acc, FP4, True, m0, m1)
        acc = _chain4(w3, _row(p03, LP), _row(p13, LP), _row(p23, LP), _row(p33, LP), acc, FP4, True, m0, m1)
        return _half(acc, False) + _half(acc, True)

    @gluon.jit
    def _row(p, LP: gl.constexpr):
        """[GPI, RUNS] -> [1, GPI, RUNS] broadcastable against the rows' [BLOCK_N, GPI, RUNS] (the same registers)."""
        return gl.expand_dims(gl.convert_layout(p, LP), 0)

    _int4_pair = gluon.jit(gemv_w4._pair_int4_half2.fn)  # nibbles J, J + 4 as subnormals (masks: in registers)

    @gluon.jit
    def _int4(x, MASK):
        """The nibble of x under MASK (bits 12..15 or 16..19) -> the float32 1 + q 2**-11 (or 2**-7)."""
        return ((x & MASK) | 0x3F800000).to(gl.float32, bitcast=True)

    _eight_columns = gluon.jit(gemv_w4._eight_columns.fn)  # the portable kernel's in-register splits

    @gluon.jit
    def _columns(a8, L: gl.constexpr):
        """[..., 8] (the last dim in-thread) -> its eight [...] columns in layout L (the same registers)."""
        a0, a1, a2, a3, a4, a5, a6, a7 = _eight_columns(a8)
        return (gl.convert_layout(a0, L), gl.convert_layout(a1, L), gl.convert_layout(a2, L),
                gl.convert_layout(a3, L), gl.convert_layout(a4, L), gl.convert_layout(a5, L),
                gl.convert_layout(a6, L), gl.convert_layout(a7, L))  # fmt: skip

    @gluon.jit
    def _load_tile(w_ptrs, a_ptrs, s_ptrs, z_ptrs, kw, KW, g3, ga, gg, stride_sk, WPG: gl.constexpr,
                   FP4: gl.constexpr, MASKED: gl.constexpr):  # fmt: skip
        """The K tile at word kw: words, activations (as stored), scales, zero points (the scales again
        for MXFP4); MASKED: the groups at or past KW (words a row) read as zeros."""
        words, s, z = _load_weights(w_ptrs, s_ptrs, z_ptrs, kw, KW, g3, gg, stride_sk, WPG, FP4, MASKED)
        return words, _load_act(a_ptrs, kw, KW, ga, WPG, MASKED), s, z

    @gluon.jit
    def _load_act(a_ptrs, kw, KW, ga, WPG: gl.constexpr, MASKED: gl.constexpr):
        """_load_tile's activations."""
        if MASKED:
            return gl.load(a_ptrs + kw * 8, mask=gl.expand_dims(gl.expand_dims(kw + ga * WPG < KW, 1), 2), other=0.0)
        return gl.load(a_ptrs + kw * 8)

    @gluon.jit
    def _load_weights(w_ptrs, s_ptrs, z_ptrs, kw, KW, g3, gg, stride_sk, WPG: gl.constexpr, FP4: gl.constexpr,
                      MASKED: gl.constexpr):  # fmt: skip
        """_load_tile's words, scales and zero points (the scales again for MXFP4)."""
        if MASKED:
            g_in = gl.expand_dims(kw + gg * WPG < KW, 0)
            words = gl.load(w_ptrs + kw, mask=gl.expand_dims(gl.expand_dims(kw + g3 * WPG < KW, 0), 2), other=0)
            s = gl.load(s_ptrs + (kw // WPG) * stride_sk, mask=g_in, other=0)
            z = s if FP4 else gl.load(z_ptrs + (kw // WPG) * stride_sk, mask=g_in, other=0)
        else:
            words = gl.load(w_ptrs + kw)
            s = gl.load(s_ptrs + (kw // WPG) * stride_sk)
            z = s if FP4 else gl.load(z_ptrs + (kw // WPG) * stride_sk)
        return words, s, z

    @gluon.jit
    def _accumulate(words, act, s, z, acc, acc_z, col_scale, m0, m1, FP4: gl.constexpr, LW: gl.constexpr,
                    LG: gl.constexpr, LR: gl.constexpr, HALF2: gl.constexpr = False):  # fmt: skip
        """One K tile into the per-word-column accumulator acc (and, int4, the per-group acc_z; HALF2: MXFP4's
        per-group sums in acc_z, int4's per-run ones, zero points included, in acc [BLOCK_N, GPI, RUNS] in LR);
        col_scale: int4's activation factor per nibble column ([1, 1, 8]; MXFP4: None, _act_scaled's 2**100;
        HALF2: the row's power of two, gemv_w4.half2_scales)."""
        if HALF2:
            act = act.to(gl.float32) * col_scale
        elif FP4:  # x 2**100, bf16 through its exponent bits
            act = _act_scaled(act)
        else:
            act = act.to(gl.float32) * col_scale
        a0, a1, a2, a3, a4, a5, a6, a7 = _columns(act, LW)
        if HALF2 and FP4:  # a run is a group: per group s sum w a'
            part = gl.convert_layout(gl.sum(_runs_half2(words, a0, a1, a2, a3, a4, a5, a6, a7, m0, m1, True, LR),
                                            axis=2), LG)  # fmt: skip
            s = (s.to(gl.int32) << 23).to(gl.float32, bitcast=True)  # e8m0: the float with exponent bits e
            acc_z = gl.fma(s, part, acc_z)  # MXFP4 has no zero points: acc_z holds the per-group sums
        elif HALF2:  # int4: per run of a group s (sum q a' 2**-24 - z sum a' 2**-24), into acc [BLOCK_N, GPI, RUNS]
            part = _runs_half2(words, a0, a1, a2, a3, a4, a5, a6, a7, m0, m1, False, LR)
            a_sum = ((a0 + a2) + (a4 + a6)) + 16.0 * ((a1 + a3) + (a5 + a7))  # [GPI, WPG], scaled
            a_sum = gl.sum(gl.reshape(a_sum, [a_sum.shape[0], a_sum.shape[1] // _WPT, _WPT]), axis=2)  # in-thread
            a_sum = gl.expand_dims(gl.convert_layout(a_sum, gl.SliceLayout(0, LR)), 0) * _INT4_HALF2_SCALE
            LS: gl.constexpr = gl.SliceLayout(2, LR)
            s = gl.expand_dims(gl.convert_layout(s.to(gl.float32), LS), 2)  # same registers
            z = gl.expand_dims(gl.convert_layout(z.to(gl.float32), LS), 2)
            acc = gl.fma(s, part - z * a_sum, acc)
        elif FP4:
            w0, w4 = _fp4_pair(words, 0, m0, m1)  # each pair multiplied as decoded: fewer values live
            part = w0 * gl.expand_dims(a0, 0)
            part = gl.fma(w4, gl.expand_dims(a4, 0), part)
            w1, w5 = _fp4_pair(words, 1, m0, m1)
            part = gl.fma(w1, gl.expand_dims(a1, 0), part)
            part = gl.fma(w5, gl.expand_dims(a5, 0), part)
            w2, w6 = _fp4_pair(words, 2, m0, m1)
            part = gl.fma(w2, gl.expand_dims(a2, 0), part)
            part = gl.fma(w6, gl.expand_dims(a6, 0), part)
            w3, w7 = _fp4_pair(words, 3, m0, m1)
            part = gl.fma(w3, gl.expand_dims(a3, 0), part)
            part = gl.fma(w7, gl.expand_dims(a7, 0), part)  # [ROWS, GPI, WPG]
            s = (s.to(gl.int32) << 23).to(gl.float32, bitcast=True)  # e8m0: the float with exponent bits e
            acc = gl.fma(gl.expand_dims(s, 2), part, acc)
        else:
            # five shifts a word: nibbles 0, 2, 3, 5 decode at float bits 12..15 to 1 + q 2**-11 (their
            # activations x 2**11), nibbles 1, 4, 6, 7 at bits 16..19 to 1 + q 2**-7 (x 2**7); per group
            # sum_k (q - z) a = sum f a' - sum a' - z sum a, the last two terms in acc_z
            t = words << 12
            part = _int4(t, m0) * gl.expand_dims(a0, 0)
            part = gl.fma(_int4(t, m1), gl.expand_dims(a1, 0), part)
            t = words << 4
            part = gl.fma(_int4(t, m0), gl.expand_dims(a2, 0), part)
            part = gl.fma(_int4(words, m0), gl.expand_dims(a3, 0), part)
            part = gl.fma(_int4(words, m1), gl.expand_dims(a4, 0), part)
            t = words >> 8
            part = gl.fma(_int4(t, m0), gl.expand_dims(a5, 0), part)
            part = gl.fma(_int4(t, m1), gl.expand_dims(a6, 0), part)
            part = gl.fma(_int4(words >> 12, m1), gl.expand_dims(a7, 0), part)
            s = s.to(gl.float32)
            acc = gl.fma(gl.expand_dims(s, 2), part, acc)
            a_lo = gl.sum((a0 + a2) + (a3 + a5), axis=1)  # [GPI], x 2**11
            a_hi = gl.sum((a1 + a4) + (a6 + a7), axis=1)  # x 2**7
            a_lo = gl.expand_dims(gl.convert_layout(a_lo, gl.SliceLayout(0, LG)), 0)  # same registers
            a_hi = gl.expand_dims(gl.convert_layout(a_hi, gl.SliceLayout(0, LG)), 0)
            a_sum = a_lo * (1.0 / 2048.0) + a_hi * (1.0 / 128.0)
            acc_z = gl.fma(s, (a_lo + a_hi) + z.to(gl.float32) * a_sum, acc_z)
        return acc, acc_z

    @gluon.jit
    def _tile_rows(i, row0, N, INTERLEAVE: gl.constexpr):
        """Tile row i's weight row (int64; rows at or past N read row 0): row0 + i, or (INTERLEAVE) gate row
        row0 + i // 2 for even i and up row N + row0 + i // 2 for odd i (w4_rows_dot)."""
        if INTERLEAVE:
            rows = row0 + i // 2
            rows = gl.where(rows < N, rows, 0) + (i % 2) * N
        else:
            rows = row0 + i
            rows = gl.where(rows < N, rows, 0)
        return rows.to(gl.int64)

    @gluon.jit
    def _tile_pointers(a_ptr, w_ptr, s_ptr, z_ptr, row0, N, stride_wn, stride_sn, stride_sk, GROUP_K: gl.constexpr,
                       ROWS: gl.constexpr, WARPS_K: gl.constexpr, INTERLEAVE: gl.constexpr):  # fmt: skip
        """w4_rows_dot's first K tile's pointers for the rows row0 + i (_tile_rows) and its index vectors: (words,
        activations, scales, zero points, the words' groups g3, the activations' groups ga and columns ja, the
        scales' groups gg)."""
        w_ptrs, s_ptrs, z_ptrs, g3, gg = _weight_pointers(w_ptr, s_ptr, z_ptr, row0, N, stride_wn, stride_sn, stride_sk,
                                                          GROUP_K, ROWS, WARPS_K, INTERLEAVE)  # fmt: skip
        a_ptrs, ga, ja = _act_pointers(a_ptr, GROUP_K, ROWS, WARPS_K)
        return w_ptrs, a_ptrs, s_ptrs, z_ptrs, g3, ga, gg, ja

    @gluon.jit
    def _weight_pointers(w_ptr, s_ptr, z_ptr, row0, N, stride_wn, stride_sn, stride_sk, GROUP_K: gl.constexpr,
                         ROWS: gl.constexpr, WARPS_K: gl.constexpr, INTERLEAVE: gl.constexpr):  # fmt: skip
        """_tile_pointers' weight half: (words, scales, zero points, the words' groups g3, the scales' groups gg)."""
        WPG: gl.constexpr = GROUP_K // 8
        GPI: gl.constexpr = 32 // (WPG // _WPT) * WARPS_K  # groups an iteration
        BLOCK_N: gl.constexpr = ROWS * (_WARPS // WARPS_K)
        L4: gl.constexpr = _layout(ROWS, WPG, _WPT, WARPS_K)
        L3: gl.constexpr = gl.SliceLayout(3, L4)  # [BLOCK_N, GPI, WPG] words
        LG: gl.constexpr = gl.SliceLayout(2, L3)  # [BLOCK_N, GPI] per group: scales, zero points

        # words: w_ptr + n * stride_wn + (kw + g * WPG + w)
        n3 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
        g3 = gl.arange(0, GPI, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
        w3 = gl.arange(0, WPG, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
        rn3 = _tile_rows(n3, row0, N, INTERLEAVE)
        w_ptrs = w_ptr + (
            gl.expand_dims(gl.expand_dims(rn3 * stride_wn, 1), 2)
            + gl.expand_dims(gl.expand_dims(g3 * WPG, 0), 2)
            + gl.expand_dims(gl.expand_dims(w3, 0), 1)
        )
        # scales, zero points: s_ptr + n * stride_sn + (kw / WPG + g) * stride_sk
        ng = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LG))
        gg = gl.arange(0, GPI, layout=gl.SliceLayout(0, LG))
        rng = _tile_rows(ng, row0, N, INTERLEAVE)
        s_off = gl.expand_dims(rng * stride_sn, 1) + gl.expand_dims(gg * stride_sk, 0)
        return w_ptrs, s_ptr + s_off, z_ptr + s_off, g3, gg

    @gluon.jit
    def _act_pointers(a_ptr, GROUP_K: gl.constexpr, ROWS: gl.constexpr, WARPS_K: gl.constexpr):
        """_tile_pointers' activation half: (pointers, the activations' groups ga, columns ja)."""
        WPG: gl.constexpr = GROUP_K // 8
        GPI: gl.constexpr = 32 // (WPG // _WPT) * WARPS_K  # groups an iteration
        LA: gl.constexpr = gl.SliceLayout(0, _layout(ROWS, WPG, _WPT, WARPS_K))  # [GPI, WPG, 8] activations
        # activations: a_ptr + 8 (kw + g * WPG + w) + j
        ga = gl.arange(0, GPI, layout=gl.SliceLayout(1, gl.SliceLayout(2, LA)))
        wa = gl.arange(0, WPG, layout=gl.SliceLayout(0, gl.SliceLayout(2, LA)))
        ja = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, LA)))
        a_ptrs = a_ptr + (
            gl.expand_dims(gl.expand_dims(ga * (8 * WPG), 1), 2)
            + gl.expand_dims(gl.expand_dims(wa * 8, 0), 2)
            + gl.expand_dims(gl.expand_dims(ja, 0), 1)
        )
        return a_ptrs, ga, ja

    @gluon.jit
    def first_weights(w_ptr, s_ptr, z_ptr, row0, N, K, stride_wn, stride_sn, stride_sk, GROUP_K: gl.constexpr,
                      ROWS: gl.constexpr, WARPS_K: gl.constexpr, FP4: gl.constexpr, EVEN: gl.constexpr,
                      INTERLEAVE: gl.constexpr = False):  # fmt: skip
        """The first K tile's words, scales and zero points of w4_rows_dot's rows (INTERLEAVE as there): constants,
        which a kernel reads before its PDL wait so that they stream under the previous kernel's tail (w0, s0, z0)."""
        WPG: gl.constexpr = GROUP_K // 8
        w_ptrs, s_ptrs, z_ptrs, g3, gg = _weight_pointers(w_ptr, s_ptr, z_ptr, row0, N, stride_wn, stride_sn, stride_sk,
                                                          GROUP_K, ROWS, WARPS_K, INTERLEAVE)  # fmt: skip
        return _load_weights(w_ptrs, s_ptrs, z_ptrs, 0, K // 8, g3, gg, stride_sk, WPG, FP4, not EVEN)

    @gluon.jit
    def _zero_accumulators(BLOCK_N: gl.constexpr, GPI: gl.constexpr, WPG: gl.constexpr, FP4: gl.constexpr,
                           L3: gl.constexpr, LG: gl.constexpr, LR: gl.constexpr, HALF2: gl.constexpr):  # fmt: skip
        """_accumulate's acc (per word column, scaled; HALF2 int4: per run of a group, in LR) and acc_z (int4: the
        zero points' and the decode bias's term; HALF2 MXFP4: the per-group sums), zeroed."""
        if HALF2 and not FP4:
            acc = gl.zeros([BLOCK_N, GPI, WPG // _WPT], gl.float32, layout=LR)
        else:
            acc = gl.zeros([BLOCK_N, GPI, WPG], gl.float32, layout=L3)
        return acc, gl.zeros([BLOCK_N, GPI], gl.float32, layout=LG)

    @gluon.jit
    def _col_factors(act, ja, a_ptr, K, FP4: gl.constexpr, HALF2: gl.constexpr, ONE_TILE: gl.constexpr):
        """(_accumulate's col_scale, _finish's out_scale). int4 in float32: nibbles 0, 2, 3, 5 decode at float bits
        12..15 (x 2**11), 1, 4, 6, 7 at 16..19 (x 2**7); MXFP4 in float32: unused (_act_scaled's 2**100 in
        _accumulate). HALF2 (act: the first K tile's activations): the row's largest |a| just below 2**15 and the
        sum scaled back, that |a| from act where it is the whole row (ONE_TILE, zeros past K), else a pass."""
        j = gl.expand_dims(gl.expand_dims(ja, 0), 1)
        out_scale = 1.0
        if HALF2:
            if ONE_TILE:
                amax = gl.max(gl.max(gl.max(gl.abs(act.to(gl.float32)), axis=2), axis=1), axis=0)
                col_scale, out_scale = half2_factors(_exp_field(amax), ja, FP4)
            else:
                col_scale, out_scale = half2_factors(_row_exp(a_ptr, K), ja, FP4)
        elif FP4:
            col_scale = 1.0  # unused (a jit function returns no None)
        else:
            col_scale = gl.where((j == 1) | (j == 4) | (j >= 6), 128.0, 2048.0)
        return col_scale, out_scale

    @gluon.jit
    def half2_factors(e, ja, FP4: gl.constexpr):
        """HALF2's (col_scale, out_scale) for the row's exponent field e (_exp_field of its largest |a|): the
        activations' power of two and the sums' inverse; int4's products are q 2**-24 a', MXFP4's w 2**-14 a', and
        int4's odd columns' nibbles 16 x larger (ja: the nibble columns, as _act_pointers gives them)."""
        col_scale, out_scale = _half2_scales(e)
        if not FP4:
            j = gl.expand_dims(gl.expand_dims(ja, 0), 1)
            out_scale = out_scale * 1024.0
            col_scale = col_scale * gl.where(j % 2 == 1, _INT4_ODD_SCALE, 1.0)
        return col_scale, out_scale

    @gluon.jit
    def _finish(acc, acc_z, out_scale, FP4: gl.constexpr, LG: gl.constexpr, HALF2: gl.constexpr):
        """The [BLOCK_N] row sums (SliceLayout(1, LG)) of _accumulate's accumulators, scaled back."""
        out = gl.sum(gl.sum(acc, axis=2), axis=1)  # [BLOCK_N]
        if HALF2 and FP4:
            out = gl.sum(acc_z, axis=1) * out_scale
        elif HALF2:  # summed over acc's runs (LR): the rows' layout the caller's
            out = gl.convert_layout(out, gl.SliceLayout(1, LG)) * out_scale
        elif FP4:
            out = out * _OUT_SCALE
        else:
            out = out - gl.sum(acc_z, axis=1)
        return out

    @gluon.jit
    def w4_rows_dot(a_ptr, w_ptr, s_ptr, z_ptr, row0, N, K, stride_wn, stride_sn, stride_sk, m0, m1,
                    FP4: gl.constexpr, GROUP_K: gl.constexpr, ROWS: gl.constexpr, WARPS_K: gl.constexpr,
                    PREFETCH: gl.constexpr, EVEN: gl.constexpr, INTERLEAVE: gl.constexpr = False,
                    HALF2: gl.constexpr = False, ONE_TILE: gl.constexpr = False, w0=None, s0=None, z0=None):  # fmt: skip
        """sum_k a[k] w[n, k] in float32 for the BLOCK_N = ROWS x NUM_WARPS / WARPS_K rows n = row0 + i
        (rows at or past N read row 0; their results are for the caller to mask): ([BLOCK_N] sums, [BLOCK_N]
        row indices), both in SliceLayout(1, LG). INTERLEAVE (a gated MLP's gate and up rows, N apart):
        tile row i is gate row row0 + i // 2 when i is even, up row N + row0 + i // 2 when odd (columns
        at or past N read column 0), and the indices returned are the columns row0 + i // 2.
        w4_gemv_sm90_kernel's loop; the MoE's GEMV (moe_gemv_sm90.py) calls it for each (token, expert)
        pair. HALF2 (gemv_w4.FP4_HALF2): nibble pairs into fp16x2, products by packed FMAs, the row scaled into
        fp16's range by a power of two (m0, m1: gemv_w4.HALF2_MASKS for MXFP4, INT4_HALF2_MASKS for int4);
        ONE_TILE (K at most one K tile): that power from the first tile's activations, which are the whole row,
        instead of a pass over the row. w0, s0, z0: the first K tile's words, scales and zero points, loaded by the
        caller (first_weights, before its PDL wait), or None."""
        WPG: gl.constexpr = GROUP_K // 8
        GPI: gl.constexpr = 32 // (WPG // _WPT) * WARPS_K  # groups an iteration
        BLOCK_N: gl.constexpr = ROWS * (_WARPS // WARPS_K)
        L4: gl.constexpr = _layout(ROWS, WPG, _WPT, WARPS_K)
        L3: gl.constexpr = gl.SliceLayout(3, L4)  # [BLOCK_N, GPI, WPG] words
        LG: gl.constexpr = gl.SliceLayout(2, L3)  # [BLOCK_N, GPI] per group: scales, zero points

        w_ptrs, a_ptrs, s_ptrs, z_ptrs, g3, ga, gg, ja = _tile_pointers(
            a_ptr, w_ptr, s_ptr, z_ptr, row0, N, stride_wn, stride_sn, stride_sk, GROUP_K, ROWS, WARPS_K, INTERLEAVE
        )
        KW = K // 8
        STEP: gl.constexpr = GPI * WPG
        LW: gl.constexpr = gl.SliceLayout(0, L3)
        LR: gl.constexpr = _runs_layout(ROWS, WPG, _WPT, WARPS_K)  # [BLOCK_N, GPI, WPG / WPT]: a thread's runs
        acc, acc_z = _zero_accumulators(BLOCK_N, GPI, WPG, FP4, L3, LG, LR, HALF2)
        if not HALF2:  # HALF2: after the first tile's loads (below)
            col_scale, out_scale = _col_factors(None, ja, a_ptr, K, FP4, HALF2, ONE_TILE)
        FIRST: gl.constexpr = PREFETCH or HALF2 or w0 is not None  # the first tile loaded before the loop
        if w0 is not None:  # its weights from the caller
            words, act, s, z = w0, _load_act(a_ptrs, 0, KW, ga, WPG, not EVEN), s0, z0
        elif FIRST:  # HALF2: the first tile's loads in flight before the pass over the row
            words, act, s, z = _load_tile(w_ptrs, a_ptrs, s_ptrs, z_ptrs, 0, KW, g3, ga, gg, stride_sk, WPG, FP4,
                                          not EVEN)  # fmt: skip
        if HALF2:
            col_scale, out_scale = _col_factors(act, ja, a_ptr, K, FP4, HALF2, ONE_TILE)
        if PREFETCH:
            for kw in range(0, KW, STEP):
                # the next tile in flight while this one is summed; past K, masked off, or (EVEN) this tile again:
                # unmasked loads need no zeroed registers a step
                kw_next = kw + STEP
                if EVEN:
                    kw_next = kw + STEP * (kw_next < KW).to(gl.int32)
                n_words, n_act, n_s, n_z = _load_tile(w_ptrs, a_ptrs, s_ptrs, z_ptrs, kw_next, KW, g3, ga, gg,
                                                      stride_sk, WPG, FP4, not EVEN)  # fmt: skip
                acc, acc_z = _accumulate(words, act, s, z, acc, acc_z, col_scale, m0, m1, FP4, LW, LG, LR, HALF2)
                words = n_words
                act = n_act
                s = n_s
                z = n_z
        else:
            start = 0
            if FIRST:  # the first tile, loaded above
                acc, acc_z = _accumulate(words, act, s, z, acc, acc_z, col_scale, m0, m1, FP4, LW, LG, LR, HALF2)
                start = STEP
            for kw in range(start, KW, STEP):
                words, act, s, z = _load_tile(w_ptrs, a_ptrs, s_ptrs, z_ptrs, kw, KW, g3, ga, gg, stride_sk, WPG, FP4,
                                              not EVEN)  # fmt: skip
                acc, acc_z = _accumulate(words, act, s, z, acc, acc_z, col_scale, m0, m1, FP4, LW, LG, LR, HALF2)
        out = _finish(acc, acc_z, out_scale, FP4, LG, HALF2)
        if INTERLEAVE:
            return out, row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LG)) // 2
        return out, row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LG))

    @gluon.jit
    def finish_rows_part(out, c_ptr, bias_ptr, ws_ptr, cnt_ptr, tile, part, parts, N, GROUP_K: gl.constexpr,
                         ROWS: gl.constexpr, WARPS_K: gl.constexpr, HAS_BIAS: gl.constexpr,
                         MAX_PARTS: gl.constexpr):  # fmt: skip
        """Part `part` of `parts` (up to MAX_PARTS: K runs, or the MoE's slots) of the w4_rows_dot sums `out` of row
        block `tile`: its float32 partial into ws [parts, 1, N], and the block's last part to arrive on cnt_ptr sums
        them in part order, adds the bias and stores c[0, n] (splitk_sm90.finish_part)."""
        LG: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, _layout(ROWS, GROUP_K // 8, _WPT, WARPS_K)))
        BLOCK_N: gl.constexpr = ROWS * (_WARPS // WARPS_K)
        splitk_sm90.finish_part(gl.expand_dims(out, 1), c_ptr, bias_ptr, c_ptr, c_ptr, ws_ptr, cnt_ptr, tile, part,
                                parts, 1, N, N, 0, BLOCK_N, 1, LG, HAS_BIAS, 0, 0, MAX_PARTS)  # fmt: skip

    @gluon.jit
    def gated_epilogue(both, n_both, bias_ptr, N, alpha, limit, ACTIVATION: gl.constexpr, HAS_BIAS: gl.constexpr):
        """The activation of w4_rows_dot's INTERLEAVE sums (tile row i: gate column i // 2 for even i, up for odd)
        plus the bias (gate n, up N + n), and their columns: ([BLOCK_N / 2] values, columns); moe_activation's
        ACTIVATION, alpha and limit."""
        BLOCK_N: gl.constexpr = both.shape[0]
        if HAS_BIAS:
            up_row = (gl.arange(0, BLOCK_N, layout=n_both.type.layout) % 2) * N
            both += gl.load(bias_ptr + n_both + up_row, mask=n_both < N, other=0.0).to(gl.float32)
        gate, up = gl.split(gl.reshape(both, [BLOCK_N // 2, 2]))
        n_out, _ = gl.split(gl.reshape(n_both, [BLOCK_N // 2, 2]))
        return _activation(gate, up, alpha, limit, ACTIVATION), n_out

    @gluon.jit
    def w4_gemv_sm90_kernel(
        a_ptr, w_ptr, c_ptr, bias_ptr, s_ptr, z_ptr,
        N, K, stride_wn, stride_sn, stride_sk, m0, m1, ws_ptr, cnt_ptr, K_SPLIT,
        FP4: gl.constexpr, GROUP_K: gl.constexpr, ROWS: gl.constexpr, WARPS_K: gl.constexpr, PREFETCH: gl.constexpr,
        EVEN: gl.constexpr, HAS_BIAS: gl.constexpr, HALF2: gl.constexpr = False, ONE_TILE: gl.constexpr = False,
        GATED: gl.constexpr = False, SPLIT_K: gl.constexpr = 1, PDL: gl.constexpr = False,
    ):  # fmt: skip
        """c[0, n] = sum_k a[0, k] w[n, k] (+ bias) for BLOCK_N = ROWS x NUM_WARPS / WARPS_K weight rows a
        program. m0, m1: the decode's bit masks (FP4_MASKS / INT4_MASKS; HALF2: gemv_w4's HALF2_MASKS /
        INT4_HALF2_MASKS). EVEN: K a multiple of the K
        tile. PREFETCH: the next K tile's loads are issued before this tile's arithmetic. ONE_TILE: K at most one
        tile (w4_rows_dot). GATED (a gated MLP's gate_up, weight [gate | up] [2 N, K]): c[0, n] = silu(g) u of the
        gate row n's sum g and the up row N + n's u (bias gate n, up N + n), BLOCK_N / 2 columns a program, their
        gate and up rows interleaved in its tile (w4_rows_dot's INTERLEAVE): the SiLU-mul's launch saved.
        SPLIT_K > 1 (not GATED): program (i, j) sums the run of K_SPLIT columns (whole K tiles) from j x K_SPLIT
        (the last run shorter), as a GEMV of its own over that run (HALF2: the run's own factor), into the float32
        workspace ws_ptr [SPLIT_K, 1, N]; the row block's last program to arrive on cnt_ptr sums the runs in order,
        adds the bias and stores (splitk_sm90.finish_part). EVEN then says that every run is whole K tiles."""
        BLOCK_N: gl.constexpr = ROWS * (_WARPS // WARPS_K)
        row0 = gl.program_id(0) * (BLOCK_N // 2 if GATED else BLOCK_N)
        if SPLIT_K > 1:  # this program's run of K: pointers moved to its first column, K its length
            k0 = gl.program_id(1) * K_SPLIT
            K = gl.minimum(K - k0, K_SPLIT)
            w_ptr += k0 // 8
            s_ptr += (k0 // GROUP_K) * stride_sk
            z_ptr += (k0 // GROUP_K) * stride_sk
        # the first K tile's weight before the wait: it streams under the previous kernel's tail
        w0, s0, z0 = first_weights(w_ptr, s_ptr, z_ptr, row0, N, K, stride_wn, stride_sn, stride_sk, GROUP_K, ROWS,
                                   WARPS_K, FP4, EVEN, GATED)  # fmt: skip
        gluon_pdl_wait(PDL)
        if SPLIT_K > 1:  # the activations (the previous kernel's output) from the run's first column
            a_ptr += gl.program_id(1) * K_SPLIT
        out, n_out = w4_rows_dot(a_ptr, w_ptr, s_ptr, z_ptr, row0, N, K, stride_wn, stride_sn, stride_sk, m0, m1, FP4,
                                 GROUP_K, ROWS, WARPS_K, PREFETCH, EVEN, GATED, HALF2, ONE_TILE, w0, s0, z0)  # fmt: skip
        if SPLIT_K > 1:  # the run's partial; the row block's last run sums them, adds the bias and stores
            finish_rows_part(out, c_ptr, bias_ptr, ws_ptr, cnt_ptr, gl.program_id(0), gl.program_id(1),
                             gl.num_programs(1), N, GROUP_K, ROWS, WARPS_K, HAS_BIAS, SPLIT_K)  # fmt: skip
            return
        if GATED:  # silu(gate) * up (moe_activation's 0)
            out, n_out = gated_epilogue(out, n_out, bias_ptr, N, 1.0, 0.0, 0, HAS_BIAS)
        elif HAS_BIAS:
            out += gl.load(bias_ptr + n_out, mask=n_out < N).to(gl.float32)
        gl.store(c_ptr + n_out, out.to(c_ptr.dtype.element_ty), mask=n_out < N)

    @gluon.jit
    def w4_gemv_sm90_blocks_kernel(
        a_ptr, w_ptr, c_ptr, bias_ptr, s_ptr, z_ptr,
        N, K, stride_wn, stride_sn, stride_sk, m0, m1,
        FP4: gl.constexpr, GROUP_K: gl.constexpr, ROWS: gl.constexpr, WARPS_K: gl.constexpr, EVEN: gl.constexpr,
        HAS_BIAS: gl.constexpr, BLOCKS: gl.constexpr, HALF2: gl.constexpr = False, PDL: gl.constexpr = False,
    ):  # fmt: skip
        """w4_gemv_sm90_kernel for K within one K tile and N whole row blocks of BLOCK_N: BLOCKS consecutive blocks
        a program (fewer in the last), each block's words, scales and zero points loaded before the previous
        block is summed, so a program keeps a block's weight in flight while it computes (at one K tile a row
        the one-block kernel has nothing to load ahead); the activations, their conversion and HALF2's factor
        once a program."""
        gluon_pdl_wait(PDL)
        WPG: gl.constexpr = GROUP_K // 8
        GPI: gl.constexpr = 32 // (WPG // _WPT) * WARPS_K
        BLOCK_N: gl.constexpr = ROWS * (_WARPS // WARPS_K)
        L3: gl.constexpr = gl.SliceLayout(3, _layout(ROWS, WPG, _WPT, WARPS_K))
        LG: gl.constexpr = gl.SliceLayout(2, L3)
        LR: gl.constexpr = _runs_layout(ROWS, WPG, _WPT, WARPS_K)
        b0 = gl.program_id(0) * BLOCKS
        last = gl.minimum(b0 + BLOCKS, N // BLOCK_N) - 1  # this program's last block
        w_ptrs, a_ptrs, s_ptrs, z_ptrs, g3, ga, gg, ja = _tile_pointers(
            a_ptr, w_ptr, s_ptr, z_ptr, b0 * BLOCK_N, N, stride_wn, stride_sn, stride_sk, GROUP_K, ROWS, WARPS_K, False
        )
        KW = K // 8
        words, act, s, z = _load_tile(w_ptrs, a_ptrs, s_ptrs, z_ptrs, 0, KW, g3, ga, gg, stride_sk, WPG, FP4, not EVEN)
        col_scale, out_scale = _col_factors(act, ja, a_ptr, K, FP4, HALF2, True)
        rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LG))
        for b in range(b0, last + 1):
            # the next block's weights (the last block's again at the end: unmasked loads), then this one's sums
            ahead = (gl.minimum(b + 1, last) - b0).to(gl.int64) * BLOCK_N
            n_words, n_s, n_z = _load_weights(w_ptrs + ahead * stride_wn, s_ptrs + ahead * stride_sn,
                                              z_ptrs + ahead * stride_sn, 0, KW, g3, gg, stride_sk, WPG, FP4,
                                              not EVEN)  # fmt: skip
            acc, acc_z = _zero_accumulators(BLOCK_N, GPI, WPG, FP4, L3, LG, LR, HALF2)
            acc, acc_z = _accumulate(words, act, s, z, acc, acc_z, col_scale, m0, m1, FP4, gl.SliceLayout(0, L3), LG,
                                     LR, HALF2)  # fmt: skip
            out = _finish(acc, acc_z, out_scale, FP4, LG, HALF2)
            n_out = b * BLOCK_N + rows
            if HAS_BIAS:
                out += gl.load(bias_ptr + n_out).to(gl.float32)
            gl.store(c_ptr + n_out, out.to(c_ptr.dtype.element_ty))
            words = n_words
            s = n_s
            z = n_z
