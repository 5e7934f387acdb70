"""Tiles of the fused-MoE GEMMs (kernels/moe.py): from a per-GPU table, else a default by batch size.

Both GEMMs of a layer share BLOCK_M (one alignment of the pairs serves both); each has its own
BLOCK_N, BLOCK_K, warps and stages. `scripts/tune_moe.py` writes the table on a GPU,
kernels/tuned/moe_<device name>.json:

    {"device": ..., KIND: {"E,H,I": {TOKENS: {"w13": GemmTiles fields, "w2": GemmTiles fields, "us": ...}}}}

KIND is the expert weights' kind ("bfloat16", "float16", "float32", "fp8_block", "mxfp4"), E the
experts, H the hidden size, I the intermediate size, TOKENS the batch's tokens (its M bucket: the
smallest tuned TOKENS >= T, else the largest, unless that is a GEMV's: a table swept at decode sizes
only leaves larger batches to the default, not to one program per pair). Entries may carry
MoeTiles' variants: "joint" and "sum_slots" (GEMV), "tma_w13", "tma_w2" and "sorted_w2" (grouped
GEMM); a variant an entry does not name (entries tuned before the variants existed name none) takes
default_variants'. No autotuning in the serving path. Without an entry the default depends on the
expected rows per expert, T * top_k / E: small blocks when each expert sees few rows (decode: the
weight read is the cost), larger ones as the rows grow.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from tritonllm import platform
from tritonllm.kernels.gemm import TUNED_DIR, GemmTiles, fit_shared_memory, gpu_family
from tritonllm.kernels.quant_formats import BLOCK


@dataclass(frozen=True)
class MoeTiles:
    w13: GemmTiles  # x @ w13[e].T with the activation (N = I, K = H)
    w2: GemmTiles  # intermediate @ w2[e].T (N = H, K = I); block_m equal to w13's
    # the GEMV's variants (kernels/moe_gemv.py): w13's gate and up rows in one pass over K (JOINT);
    # w2 summing each token's top-k slots in registers, its block_n then shared by the slots (SLOTS)
    joint: bool = False
    sum_slots: bool = False
    # the grouped GEMM's (kernels/moe.py): each launch's expert weights through a tensor descriptor
    # (TMA_B); w13 writing the intermediate in the alignment's order, w2 reading its blocks' rows whole,
    # through a descriptor (SORTED_C / SORTED_A)
    tma_w13: bool = False
    tma_w2: bool = False
    sorted_w2: bool = False

    def __post_init__(self) -> None:
        if self.w13.gemv != self.w2.gemv:
            raise ValueError("MoE tiles: both launches are GEMVs (kernels/moe_gemv.py) or neither")
        if (self.joint or self.sum_slots) and not self.w13.gemv:
            raise ValueError("MoE tiles: joint and sum_slots are variants of the GEMV (gemv tiles)")
        if (self.tma_w13 or self.tma_w2 or self.sorted_w2) and self.w13.gemv:
            raise ValueError(
                "MoE tiles: tma_w13, tma_w2 and sorted_w2 are variants of the grouped GEMM (not gemv tiles)"
            )
        if self.w13.block_m != self.w2.block_m:
            raise ValueError(f"MoE tiles: both GEMMs take one BLOCK_M, not {self.w13.block_m} and {self.w2.block_m}")

    @property
    def block_m(self) -> int:
        return self.w13.block_m

    @property
    def gemv(self) -> bool:
        """Decode-sized batches: one program per (pair, BLOCK_N columns), no alignment (kernels/moe_gemv.py)."""
        return self.w13.gemv


def moe_kind(dtype: torch.dtype, fmt: str | None) -> str:
    """The table's kind of experts: their quantized format's, or the activations' dtype."""
    return {None: str(dtype).removeprefix("torch."), "fp8:block:group": "fp8_block", "mxfp4:mx:none": "mxfp4"}[fmt]


def tuned_file(device_name: str) -> Path:
    return TUNED_DIR / f"moe_{device_name.replace(' ', '_')}.json"


@functools.cache
def _table(device_name: str) -> dict:
    path = tuned_file(device_name)
    return json.loads(path.read_text()) if path.exists() else {}


def tuned_entry(kind: str, e: int, h: int, i: int, tokens: int, device_name: str) -> dict | None:
    """The table's entry for T = tokens (module docstring), or None."""
    shapes = _table(device_name).get(kind, {}).get(f"{e},{h},{i}")
    if not shapes:
        return None
    buckets = sorted(int(t) for t in shapes)
    entry = shapes[str(next((t for t in buckets if t >= tokens), buckets[-1]))]
    if tokens > buckets[-1] and entry["w13"].get("gemv"):  # a table of decode sizes only: not for a prefill
        return None
    return entry


def entry_tiles(entry: dict) -> MoeTiles:
    """A table entry's tiles and the variants it names (absent ones off)."""
    variants = {k: entry[k] for k in VARIANTS if k in entry}
    return MoeTiles(GemmTiles(**entry["w13"]), GemmTiles(**entry["w2"]), **variants)


def tuned_moe_tiles(kind: str, e: int, h: int, i: int, tokens: int, device_name: str) -> MoeTiles | None:
    entry = tuned_entry(kind, e, h, i, tokens, device_name)
    return None if entry is None else entry_tiles(entry)


def default_variants(tiles: MoeTiles, family: str, kind: str, tokens: int, rows_per_expert: float) -> dict[str, bool]:
    """The variants where the H200 measured them faster (experiments/moe/README.md, session 27), for
    Hopper: the GEMV's joint and sum_slots at one token (3-16% a layer: Qwen3-30B-A3B bf16 / FP8 block /
    MXFP4, gpt-oss bf16; +-2% elsewhere; at four tokens joint lost up to 12%), the grouped GEMM's
    three descriptor reads together for float and FP8-block experts beyond 32 rows an expert (4-17% at
    1024-8192 tokens; MXFP4 keeps pointer loads). Elsewhere (other GPUs, the interpreter) all off."""
    if family != "hopper":
        return {}
    if tiles.gemv:
        return dict(joint=True, sum_slots=True) if tokens == 1 else {}
    if kind in ("bfloat16", "float16", "fp8_block") and rows_per_expert > 32:
        return dict.fromkeys(GROUPED_VARIANTS, True)
    return {}


# the variants by name (MoeTiles' flags): the GEMV's, then the grouped GEMM's; TRITONLLM_MOE_VARIANTS
# ("joint,sum_slots", "tma" for both tma_*, ..., or "none") sets them over the table's and the default's
# for A/B runs (scripts/bench_moe.py --variants, gpu_check.sh moe-variants)
GEMV_VARIANTS = ("joint", "sum_slots")
GROUPED_VARIANTS = ("tma_w13", "tma_w2", "sorted_w2")
VARIANTS = GEMV_VARIANTS + GROUPED_VARIANTS


# the float GEMV's K reduction (kernels/moe_gemv.py _row_dot's REDUCE): 0 a cross-thread sum every step,
# 1 per column, summed once after the loop, 2 per thread's eight columns every step. 2 is the default, from
# the sm90 SASS, not yet timed: the H200 measured 1 (session 26's) slower than session 9's per-step sum on
# gpt-oss bf16 (106 / 274 us at 1 / 4 tokens against 68 / 191), and 1 holds the whole float tile (w13 78-82
# registers, joint 148); 2 issues the same loads, no barrier in the loop, the fewest registers of the three
# (w13 54, w2 30-34, joint 70; 0: 62, 54, 94) and 3.9 loop instructions a weight (1: 3.4, 0: 5.8; issue
# is not the bound: ~4 us of a 16 us weight read at one token). experiments/moe/README.md, session 27, has
# the A/B command
GEMV_REDUCES = (0, 1, 2)
DEFAULT_GEMV_REDUCE = 2


def _mode_from_env(name: str, modes: tuple[int, ...], default: int) -> int:
    """An A/B switch: the environment's `name` (one of `modes`, else refused by name), or `default`."""
    text = os.environ.get(name, str(default))
    if text not in {str(m) for m in modes}:
        raise ValueError(f"{name}={text!r}: one of {modes}")
    return int(text)


@functools.cache
def gemv_reduce() -> int:
    """The float GEMV's K reduction: TRITONLLM_MOE_GEMV_REDUCE (for A/B runs), else DEFAULT_GEMV_REDUCE."""
    return _mode_from_env("TRITONLLM_MOE_GEMV_REDUCE", GEMV_REDUCES, DEFAULT_GEMV_REDUCE)


# when the GEMV issues a step's loads (kernels/moe_gemv.py LOADS; MXFP4: gemv_w4.w4_row_dot's): 0 the
# scales late (MXFP4's after the activation's layout change, behind its barriers, FP8 block's after the
# products: in the sm90 SASS a step then waits out two memory latencies; what every figure so far measured),
# 1 every load at the top of its step, 2 a step ahead in registers (sm90: MXFP4 w13 joint 8 x 1024 96 -> 128
# registers, FP8 block w13 32 -> 65, bf16 w13 54 -> 128). The H100 A/B (session 29, `gpu_check.sh moe-loads`,
# the decode layer's kernels with L2 flushed) for MXFP4 read as words: 1 beat 0 at every shape (gpt-oss 1 / 4
# tokens 51.3 -> 47.8 / 139.7 -> 134.6 us, Qwen3-30B-A3B 22.0 -> 20.6 / 60.3 -> 58.9 us) and 2 was within 1%
# of 1 (better for gpt-oss, worse for Qwen3): MXFP4 takes 1. The float and FP8-block paths were not timed: 0
GEMV_LOADS = (0, 1, 2)
DEFAULT_GEMV_LOADS = {"words": 1, "other": 0}


@functools.cache
def gemv_loads(words: bool = False) -> int:
    """The GEMV's load schedule: TRITONLLM_MOE_GEMV_LOADS (for A/B runs), else DEFAULT_GEMV_LOADS's for MXFP4
    read as words (`words`) or the other paths."""
    return _mode_from_env("TRITONLLM_MOE_GEMV_LOADS", GEMV_LOADS, DEFAULT_GEMV_LOADS["words" if words else "other"])


# w2's MXFP4 GEMV with summed slots issuing its expert ids and first K step's weights before its PDL wait
# (kernels/moe_gemv.py EARLY), so that they stream while w13 drains: 0 off, 1 on (LOADS 1 / 2; it pays with PDL
# only, and is correct without: the interpreter tests run it). H100, session 30 (`gpu_check.sh moe-early`): the
# gpt-oss decode layer's GEMVs with PDL 51.6 -> 47.5 us (graph window, L2 flushed; Qwen3-30B-A3B's 20.5 both),
# gpt-oss-20b batch 1 TPOT p50 2.454 / 2.458 -> 2.407 / 2.411 ms (two runs each, +2.0% tok/s): on
DEFAULT_GEMV_EARLY = 1


@functools.cache
def gemv_early() -> bool:
    """Whether w2's MXFP4 slot GEMV loads ahead of its PDL wait: TRITONLLM_MOE_GEMV_EARLY, else DEFAULT_GEMV_EARLY."""
    return bool(_mode_from_env("TRITONLLM_MOE_GEMV_EARLY", (0, 1), DEFAULT_GEMV_EARLY))


@functools.cache
def variants_override() -> dict[str, bool] | None:
    text = os.environ.get("TRITONLLM_MOE_VARIANTS")
    if text is None:
        return None
    names = {n for n in text.replace(" ", "").split(",") if n and n != "none"}
    if "tma" in names:  # every descriptor read
        names = (names - {"tma"}) | set(GROUPED_VARIANTS)
    if not names <= set(VARIANTS):
        raise ValueError(
            f"TRITONLLM_MOE_VARIANTS={text!r}: names among {VARIANTS} (or tma), comma-separated, or 'none'"
        )
    return {n: n in names for n in VARIANTS}


# up to this many expected pairs per expert the GEMV (no alignment, no row padding) is the default:
# pairs of one expert each read its weight, which pays while they are about one per expert touched
GEMV_ROWS_PER_EXPERT = 0.5


def default_moe_tiles(rows_per_expert: float, family: str, kind: str = "bfloat16") -> MoeTiles:
    if rows_per_expert <= GEMV_ROWS_PER_EXPERT:  # wide K tiles: 512 B of weight per row and step
        # the interpreter runs a program's tile as numpy operations at a cost a program: 128 columns, not 16
        # (the tests' experts in one or two programs a pair; the kernel tests pass 16-column tiles)
        t = GemmTiles(1, 128 if family == "cpu" else 16, 512 if kind == "mxfp4" else 256, 4, 2, 1, gemv=True)
        return MoeTiles(t, t)
    # the interpreter: few, wide programs (tests' shapes are small; the kernel tests pass small tiles)
    if family == "cpu":
        t = GemmTiles(16, 128, 128, 1, 1, 4)
        return MoeTiles(t, t)
    stages = 2 if family == "cdna" else 4
    if kind == "fp8_block" and rows_per_expert > 32:
        # one 128 x 128 scale block a tile and K step (vLLM's and SGLang's block-FP8 default shape): each K
        # step ends in a scaled add of its dot, so BLOCK_K 64 would double those waits; eight warps for
        # w13's two accumulators (four spill in the sm90 build, as do the float tiles below at 128 rows:
        # scripts/cross_compile_moe.py); untuned (session 9: 94 TFLOP/s at 8192 tokens on 128 x 128 x 64)
        t = GemmTiles(64, 128, 128, 8, min(stages, 3), 8)
        return MoeTiles(t, t)
    if rows_per_expert <= 8:
        t = GemmTiles(16, 64, 128, 4, stages, 8)
    elif rows_per_expert <= 32:
        t = GemmTiles(32, 64, 128, 4, stages, 8)
    elif rows_per_expert <= 128:
        # MXFP4's w13 (two accumulators and the nibble unpacking) spills on four warps in Triton 3.6's sm90
        # build (the GPU image's; 3.9 fits it): eight
        t = GemmTiles(64, 128, 64, 8 if kind == "mxfp4" else 4, min(stages, 3), 8)
    elif family == "hopper" and kind in ("bfloat16", "float16"):
        # the H100's sweep at Qwen3-30B-A3B's shape, 8192 tokens (512 rows an expert; experiments/moe/README.md,
        # session 41): four stages, and w2 256 columns wide, 456 TFLOP/s a layer with the descriptor reads; the
        # previous default (128 x 128 x 64, three stages, both launches) took 869.7 / 578.9 us against 811.2 / 530.7
        return MoeTiles(GemmTiles(128, 128, 64, 8, 4, 8), GemmTiles(128, 256, 64, 8, 4, 8))
    else:
        t = GemmTiles(128, 128, 64, 8, min(stages, 3), 8)
    return MoeTiles(t, t)


def pick_moe_tiles(kind: str, e: int, h: int, i: int, tokens: int, top_k: int, a_bytes: int, b_bytes: int) -> MoeTiles:
    """The table's tiles for this GPU and shape, else the default; fitted to shared memory (w13 holds
    two B tiles: gate and up) and to the format's scale groups (FP8 block: BLOCK_K <= 128)."""
    entry = None
    if platform.is_gpu():
        entry = tuned_entry(kind, e, h, i, tokens, torch.cuda.get_device_name(platform.DEVICE))
    family = gpu_family()
    rows_per_expert = tokens * top_k / e
    tiles = default_moe_tiles(rows_per_expert, family, kind) if entry is None else entry_tiles(entry)
    # default_variants' for each variant the entry does not name
    defaults = default_variants(tiles, family, kind, tokens, rows_per_expert)
    tiles = replace(tiles, **{k: v for k, v in defaults.items() if entry is None or k not in entry})
    override = variants_override()
    if override is not None:
        tiles = replace(tiles, **{k: override[k] for k in (GEMV_VARIANTS if tiles.gemv else GROUPED_VARIANTS)})
    return fit_moe_tiles(tiles, kind, a_bytes, b_bytes, family)


def fit_moe_tiles(tiles: MoeTiles, kind: str, a_bytes: int, b_bytes: int, family: str | None = None) -> MoeTiles:
    w13, w2 = tiles.w13, tiles.w2
    if not tiles.gemv:  # the GEMV stages nothing through shared memory
        w13 = fit_shared_memory(w13, a_bytes, 2 * b_bytes, family)
        w2 = fit_shared_memory(w2, a_bytes, b_bytes, family)
    if kind == "fp8_block":  # each K tile inside one 128-column scale group
        w13, w2 = (replace(t, block_k=min(t.block_k, BLOCK)) for t in (w13, w2))
    return replace(tiles, w13=w13, w2=w2)
