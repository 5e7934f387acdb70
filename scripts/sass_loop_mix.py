"""The SASS instruction mix of the 4-bit GEMV's inner loop (kernels/gemv_w4.py) for NVIDIA sm90,
without a GPU: the kernel is compiled at the decode tile of the H200 table (M = 1: 16 rows x 128
words, four warps) with Triton's bundled ptxas, disassembled with its nvdisasm, and the loop's
instructions counted by opcode and per weight. At M = 1 the GEMV is bound by instruction issue as
much as by HBM (experiments/quant4/README.md), so this count is the figure a decode change moves.

    python scripts/sass_loop_mix.py [--fp4] [--block-n 16] [--block-w 128] [--warps 4]
    python scripts/sass_loop_mix.py --gluon [--fp4] [--half2 [--one-tile]] [--blocks 4]   # the Hopper kernel (kernels/gemv_w4_sm90.py)
    python scripts/sass_loop_mix.py --gemm [--fp4] [--block-n 128] [--block-m 16] [--scale-after] [--prefetch 2] [--x-at-step]   # the Hopper W4 MMA GEMM (M 2..64)
    python scripts/sass_loop_mix.py --moe w13|w13-joint|w2|w2-slots [--fp4] [--slots 4] [--block-n 16] [--block-w 64] [--loads 0|1|2] [--ragged-k [--aligned-rows]] [--half2 [--a-bound 57]]   # the MoE GEMV (kernels/moe_gemv.py; bf16 experts without --fp4)
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import sys

os.environ["TRITON_INTERPRET"] = "0"  # before tritonllm.platform, which would switch it on without a GPU

# isort: split
from cross_compile_attention import (  # this folder: sys.path[0] when run as a script
    compile_kernel,
    disassemble,
    registers,
)
from cross_compile_moe import DIVISIBLE as MOE_DIVISIBLE
from cross_compile_moe import RAGGED_K, compile_moe
from triton.backends.compiler import GPUTarget

from tritonllm.kernels import gemm_w4_sm90, gemv_w4, gemv_w4_sm90
from tritonllm.kernels.gemm import GemmTiles

DIVISIBLE = ("a_ptr", "w_ptr", "c_ptr", "s_ptr", "z_ptr", "ws_ptr", "K", "N", "K_PER_SPLIT", "stride_am",
             "stride_wn", "stride_cm", "stride_sn")  # fmt: skip


def loop_mix(sass: str) -> collections.Counter:
    """Opcodes (without modifiers) of the largest backward branch's loop in nvdisasm output (the K loop: a
    prologue's loop, such as FP4_HALF2's pass for the rows' largest activations, is shorter)."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"(\.L_x_\d+):", line))}
    loops = []
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s.*?(\.L_x_\d+)", line)
        if m and labels.get(m.group(1), i) < i:
            ops = collections.Counter()
            for body in lines[labels[m.group(1)] : i + 1]:
                op = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", body)
                if op:
                    ops[op.group(1)] += 1
            loops.append(ops)
    if not loops:
        raise ValueError("no loop found in the SASS")
    return max(loops, key=lambda ops: sum(ops.values()))


def main(argv: list[str] | None = None) -> collections.Counter:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp4", action="store_true", help="MXFP4 (e2m1, e8m0 per 32) instead of int4 g128")
    parser.add_argument("--block-n", type=int, default=16)
    parser.add_argument("--block-w", type=int, default=128, help="int32 words (8 weights each) a row per iteration")
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument("--gluon", action="store_true", help="the sm90 Gluon GEMV (its own fixed tile) instead")
    parser.add_argument("--one-tile", action="store_true", help="--gluon --half2: K in one tile (ONE_TILE)")
    parser.add_argument("--blocks", type=int, default=1, help="--gluon: row blocks a program (the blocked kernel)")
    parser.add_argument("--gated", action="store_true", help="--gluon: gate_up's SiLU-mul in the epilogue (GATED)")
    parser.add_argument("--gemm", action="store_true", help="the sm90 Gluon int4 GEMM (kernels/gemm_w4_sm90.py)")
    parser.add_argument("--block-m", type=int, default=16, help="--gemm: activation rows (the MMA's N)")
    parser.add_argument("--scale-after", action="store_true", help="--gemm: the scale applied after each MMA")
    parser.add_argument("--prefetch", type=int, default=1, help="--gemm: K steps of words loaded ahead (0, 1, 2)")
    parser.add_argument("--x-at-step", action="store_true", help="--gemm: the activation tile loaded at its step")
    parser.add_argument(
        "--half2",
        action="store_true",
        help="--fp4 (portable GEMV, --gluon, --moe): the fp16x2 decode and products (TRITONLLM_W4_HALF2)",
    )
    parser.add_argument("--moe", choices=("w13", "w13-joint", "w2", "w2-slots"), help="the MoE GEMV's launch instead")
    parser.add_argument("--slots", type=int, default=4, help="--moe w2-slots: the slots a program sums (power of 2)")
    parser.add_argument("--loads", type=int, choices=(0, 1, 2), help="--moe: the GEMV's load schedule (LOADS)")
    parser.add_argument(
        "--ragged-k",
        action="store_true",
        help="--moe: B's row stride not a multiple of 16, K not one of the tile (gpt-oss's 2880: rows of 360 words)",
    )
    parser.add_argument(
        "--aligned-rows",
        action="store_true",
        help="--ragged-k: B's rows 16-word aligned all the same (layers/moe.py aligned_rows, MXFP4)",
    )
    parser.add_argument(
        "--a-bound",
        type=float,
        default=0.0,
        help="--moe --half2: a bound on |a| in place of the pass over the rows (w2 after gpt-oss's activation: 57)",
    )
    args = parser.parse_args(argv)
    if args.moe:
        return report(
            *compile_moe_gemv(
                args.moe,
                args.fp4,
                args.block_n,
                args.block_w,
                args.warps,
                args.slots,
                args.loads,
                args.ragged_k,
                args.aligned_rows,
                args.half2,
                gemv_w4.half2_bound_exp(args.a_bound),
            )
        )
    if args.gemm:  # a thread's weights a K step: BLOCK_N x 128 over the warpgroup's 128 threads
        kernel = gemm_w4_sm90.compile_sm90(block_n=args.block_n, bm=args.block_m, fp4=args.fp4,
                                           scale_after=args.scale_after, prefetch=args.prefetch,
                                           x_ahead=not args.x_at_step)  # fmt: skip
        return report(kernel, args.block_n)
    if args.gluon:
        tiling = gemv_w4_sm90.TILINGS["fp4" if args.fp4 else "int4"]
        if args.blocks > 1:
            tiling = dataclasses.replace(tiling, blocks=args.blocks)
        kernel = gemv_w4_sm90.compile_sm90(fp4=args.fp4, tiling=tiling, half2=args.half2, one_tile=args.one_tile,
                                           gated=args.gated)  # fmt: skip
        return report(kernel, tiling.rows * gemv_w4_sm90.WPT * 8)  # a thread's weights, an iteration
    scale = "*u8" if args.fp4 else "*fp16"
    types = dict(a_ptr="*bf16", w_ptr="*i32", c_ptr="*bf16", bias_ptr="*bf16", s_ptr=scale, z_ptr=scale,
                 ws_ptr="*fp32")  # fmt: skip
    constexprs = dict(FP4=args.fp4, FP4_BITS=gemv_w4.FP4_HALF2 if args.half2 else gemv_w4.FP4_F32, GROUP_K=32 if args.fp4 else 128, HAS_BIAS=False, EVEN=True,
                      SPLIT_K=1, BLOCK_M=1, BLOCK_N=args.block_n, BLOCK_W=args.block_w, PDL=True, stride_ak=1,
                      stride_cn=1, stride_sk=1)  # fmt: skip
    kernel = compile_kernel(gemv_w4.w4_gemv_kernel, GPUTarget("cuda", 90, 32), types, constexprs, args.warps, DIVISIBLE)
    return report(kernel, args.block_n * args.block_w * 8 / (32 * args.warps))  # a thread's weights an iteration


def compile_moe_gemv(launch: str, fp4: bool, block_n: int, block_w: int, warps: int, slots: int, loads=None,
                     ragged_k: bool = False, aligned_rows: bool = False, half2: bool = False,
                     a_exp: int = 0) -> tuple:  # fmt: skip
    """The MoE GEMV (kernels/moe_gemv.py) for sm90 as the launcher builds it (cross_compile_moe.compile_moe):
    MXFP4 experts read as words (fp4) or bf16 ones, BLOCK_K = 8 x block_w (bf16: block_w x 8 values too); w13
    gated (gate and up loops apart, or `-joint` in one pass), w2 per pair or summing `slots` slots (its block_n
    the tile's rows shared by them). Returns (kernel, a thread's weights an iteration)."""
    gated, slot_count = launch.startswith("w13"), slots if launch == "w2-slots" else 0
    variant = dict(joint=launch == "w13-joint", slots=slot_count)
    if loads is not None:
        variant["loads"] = loads
    if ragged_k:
        variant["even_k"] = False
    if half2:
        variant["fp4_bits"] = gemv_w4.FP4_HALF2
        variant["a_exp"] = a_exp
    tiles = GemmTiles(1, block_n, 8 * block_w, warps, 3, 1, gemv=True)
    kernel = compile_moe(
        "mxfp4" if fp4 else "bfloat16", gated, tiles, variant,
        divisible=RAGGED_K if ragged_k and not aligned_rows else MOE_DIVISIBLE,
    )  # fmt: skip
    bn = max(1, block_n // slot_count) if slot_count else block_n
    rows = bn * (2 if gated and launch.endswith("joint") else 1) * max(1, slot_count)  # rows an iteration
    return kernel, rows * block_w * (8 if fp4 else 1) * (1 if fp4 else 8) / (32 * warps)


def report(kernel, weights: float) -> collections.Counter:
    """Print the loop's mix of a compiled kernel, per weight (`weights`: a thread's an iteration)."""
    sass = disassemble(kernel)
    ops = loop_mix(sass)
    total = sum(ops.values())
    print(f"loop: {total} instructions a thread an iteration, {weights:.0f} weights: {total / weights:.2f} a weight")
    print(
        f"kernel: {len(re.findall(r'/[*][0-9a-f]{4}[*]/[ ]+[@A-Z]', sass))} instructions in all, "
        f"{registers(kernel)} registers a thread"
    )
    print("spills to local memory" if "LDL" in ops or "STL" in ops else "no spills")
    for op, n in ops.most_common():
        print(f"  {op:8s} {n:5d}  {n / weights:.2f}")
    return ops


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
