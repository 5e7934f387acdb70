"""Compile the fused-MoE kernels (kernels/moe.py, moe_gemv.py) for NVIDIA sm90 without a GPU, and report
per build whether ptxas spilled registers to local memory, which a slow MoE layer can hide behind: the
default tiles of every kind at every rows-per-expert bucket (kernels/moe_tiles.py default_moe_tiles), both
launches (w13 gated with its two accumulators, w2), and the variants (JOINT, SLOTS, TMA_B, SORTED_A/TMA_A).

    python scripts/cross_compile_moe.py            # ~1 minute on a laptop CPU
    python scripts/cross_compile_moe.py --all      # also every tile of the H200 table
    python scripts/cross_compile_moe.py --targets  # also sm80 and gfx942 (below)

Prints one line a build: "<kind> <launch> <tiles> [variant]: ok | spills | error ..."; exit status 1 if any
build fails or a plain one (no variant: what runs by default) spills. A variant's spill is reported: the
tuner, which times it, leaves it out where it is slower.

The fused router (kernels/moe_route.py's router_route_kernel) builds first, at gpt-oss's, Qwen3-30B-A3B's
and Mixtral's decode shapes.

--targets: one source for CUDA and ROCm, as before the spill check: the router (kernels/moe_route.py) at
Qwen3 / DeepSeek / gpt-oss expert counts, the alignment (kernels/moe_align.py: one program counting itself,
and the counted multi-program path) and both fused-MoE launches at every default tile bucket (variants off)
for sm90, sm80 and gfx942. sm80 has no FP8: its FP8 builds are expected to fail.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # before tritonllm.platform, which would switch it on without a GPU

# isort: split
from cross_compile_attention import compile_kernel, disassemble  # this folder: sys.path[0] when run as a script
from cross_compile_gemm import TARGETS, run_checks
from triton.backends.compiler import GPUTarget

from tritonllm.kernels import moe_align, moe_route
from tritonllm.kernels.gemm import GemmTiles
from tritonllm.kernels.moe import fused_moe_kernel
from tritonllm.kernels.moe_gemv import moe_gemv_kernel
from tritonllm.kernels.moe_tiles import MoeTiles, default_moe_tiles, fit_moe_tiles, gemv_loads, gemv_reduce, tuned_file

SM90 = GPUTarget("cuda", 90, 32)
# kind -> (A's type, B's type, B scales' type, QUANT, GROUP_K)
KINDS = {"bfloat16": ("bf16", "bf16", "fp32", 0, 1), "fp8_block": ("fp8e4nv", "fp8e4nv", "fp32", 1, 128),
         "mxfp4": ("bf16", "u8", "u8", 2, 32)}  # fmt: skip
OPERAND_BYTES = {"bfloat16": (2, 2), "fp8_block": (1, 1), "mxfp4": (2, 1)}  # (A, B) bytes, as fused_moe fits tiles
BUCKETS = (0.1, 4, 16, 64, 500)  # rows per expert: the GEMV, then each grouped bucket
DIVISIBLE = ("a_ptr", "b_ptr", "c_ptr", "K", "N", "stride_am", "stride_be", "stride_bn", "stride_cm")
# gpt-oss: K = 2880 is a multiple of 16, its 360-word MXFP4 rows are not
RAGGED_K = tuple(d for d in DIVISIBLE if d != "stride_bn")


def compile_moe(kind: str, gated: bool, tiles: GemmTiles, variant: dict, target: GPUTarget = SM90,
                divisible: tuple[str, ...] = DIVISIBLE):  # fmt: skip
    """One launch's kernel as kernels/moe.py launches it, compiled for `target` (also scripts/sass_loop_mix.py
    --moe); `variant`: joint, slots, reduce, loads, early, fp4_bits (the GEMV; gemv_w4.FP4_HALF2...), a_exp (its A_EXP), tma_b, sorted_a, one_b_group (the grouped
    GEMM), even_k (default True); `divisible`: the arguments specialised as multiples of 16 (RAGGED_K's:
    gpt-oss's K = 2880, whose MXFP4 rows are 360 words). Raises what the compiler raises."""
    fn, types, constexprs = moe_signature(kind, gated, tiles, variant, target)
    return compile_kernel(fn, target, types, constexprs, tiles.num_warps, divisible, tiles.num_stages)


def moe_signature(kind: str, gated: bool, tiles: GemmTiles, variant: dict, target: GPUTarget) -> tuple:
    """(kernel, argument types, constexprs) of one launch, as compile_moe builds it."""
    a_t, b_t, s_t, quant, group_k = KINDS[kind]
    cuda = target.backend == "cuda"
    pdl = cuda and target.arch >= 90  # programmatic dependent launch: Hopper on
    if not cuda:  # MI300's FP8
        a_t, b_t = (t.replace("fp8e4nv", "fp8e4b8") for t in (a_t, b_t))
    words = quant == 2 and tiles.gemv
    types = dict(a_ptr=f"*{a_t}", b_ptr="*i32" if words else f"*{b_t}", c_ptr="*bf16", bias_ptr="*bf16",
                 a_scale_ptr="*fp32", b_scale_ptr=f"*{s_t}", topk_weights_ptr="*fp32", alpha="fp32", limit="fp32")  # fmt: skip
    common = dict(A_ROW_DIV=8 if gated else 1, GATED=gated, ACTIVATION=0, HAS_BIAS=False, MUL_WEIGHTS=not gated,
                  QUANT=quant, GROUP_K=group_k, EVEN_K=variant.get("even_k", True), BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, PDL=pdl,
                  stride_ak=1, stride_bk=1, stride_cn=1)  # fmt: skip
    if tiles.gemv:
        fn, types["topk_ids_ptr"] = moe_gemv_kernel, "*i32"
        slots = variant.get("slots", 0)
        constexprs = dict(common, WORDS=words, FP4_BITS=variant.get("fp4_bits", int(cuda)), JOINT=variant.get("joint", False), SLOTS=slots,
                          REDUCE=variant.get("reduce", gemv_reduce()), LOADS=variant.get("loads", gemv_loads(words)),
                          EARLY=variant.get("early", False), A_EXP=variant.get("a_exp", 0))  # fmt: skip
        if slots:
            constexprs["BLOCK_N"] = max(1, tiles.block_n // slots)
    else:
        fn = fused_moe_kernel
        types.update(sorted_ids_ptr="*i32", block_expert_ptr="*i32")
        tma_b, sorted_a = variant.get("tma_b", False), variant.get("sorted_a", False)
        # FP8 block: the launcher's one_b_group at a shape whose N is whole 128-row blocks (Qwen3-30B-A3B's)
        one_group = variant.get("one_b_group", quant == 1 and group_k % tiles.block_n == 0)
        constexprs = dict(common, IEEE=False, BLOCK_M=tiles.block_m, GROUP_M=tiles.group_m, TMA_B=tma_b,
                          SORTED_A=sorted_a, TMA_A=sorted_a, SORTED_C=False, ONE_B_GROUP=one_group)  # fmt: skip
        if tma_b:
            types["b_desc"] = f"tensordesc<{b_t}[{tiles.block_n}, {tiles.block_k}]>"
        else:
            constexprs["b_desc"] = None
        if sorted_a:
            types["a_desc"] = f"tensordesc<{a_t}[{tiles.block_m}, {tiles.block_k}]>"
        else:
            constexprs["a_desc"] = None
    return fn, types, constexprs


def sass_status(compile_fn) -> str:
    """A build's result: 'ok', 'spills' (local memory in the SASS) or the error's first line."""
    try:
        sass = disassemble(compile_fn())
    except Exception as error:  # noqa: BLE001 - reported
        return "error " + str(error).splitlines()[0][:160]
    return "spills" if "LDL" in sass or "STL" in sass else "ok"


def build(kind: str, gated: bool, tiles: GemmTiles, variant: dict) -> str:
    """compile_moe's result (sass_status)."""
    return sass_status(lambda: compile_moe(kind, gated, tiles, variant))


def cases(all_tuned: bool) -> list[tuple[str, bool, GemmTiles, dict, str]]:
    """(kind, gated, tiles, variant, label): every kind's default tiles per bucket, fitted as fused_moe
    fits them, each launch plain and with its variants; --all: the H200 table's tiles too."""
    out = []
    for kind in KINDS:
        a_bytes, b_bytes = OPERAND_BYTES[kind]
        tiled = [(f"default {rows}", fit_moe_tiles(default_moe_tiles(rows, "hopper", kind), kind, a_bytes, b_bytes,
                                                   "hopper")) for rows in BUCKETS]  # fmt: skip
        if all_tuned:
            import json

            table = json.loads(tuned_file("NVIDIA H200").read_text()).get(kind, {})
            for shape, buckets in table.items():
                for tokens, entry in buckets.items():
                    moe = MoeTiles(GemmTiles(**entry["w13"]), GemmTiles(**entry["w2"]))
                    tiled.append((f"table {shape} T={tokens}", fit_moe_tiles(moe, kind, a_bytes, b_bytes, "hopper")))
        for label, moe in tiled:
            gemv = moe.gemv
            for gated, tiles in ((True, moe.w13), (False, moe.w2)):
                variants = [{}]
                if gemv:
                    variants.append(dict(joint=True) if gated else dict(slots=8))
                    if kind == "mxfp4" and not gated:  # w2's loads before the PDL wait (moe_tiles.gemv_early)
                        variants.append(dict(slots=8, early=True))
                elif kind != "mxfp4":
                    variants.append(dict(tma_b=True) if gated else dict(tma_b=True, sorted_a=True))
                elif not gated:
                    variants.append(dict(sorted_a=True))
                out += [(kind, gated, tiles, v, label) for v in variants]
    return out


# the fused router (moe_route.router_route_kernel) at decode sizes: (experts, top_k, hidden, tokens) of
# gpt-oss-20b, Qwen3-30B-A3B and Mixtral-8x7B
ROUTER_SHAPES = ((32, 4, 2880, 1), (128, 8, 2048, 8), (8, 2, 4096, 4))
# and with the norm folded in (norm_router_route: at most NORM_ROUTER_MAX_TOKENS tokens), gpt-oss's and Qwen3's
NORM_ROUTER_SHAPES = ((32, 4, 2880, 1), (128, 8, 2048, moe_route.NORM_ROUTER_MAX_TOKENS))


def router_checks(pdl: dict) -> list[tuple]:
    """run_checks's (name, kernel, types, constexprs, num_warps, uses_fp8) for the fused router's builds."""
    checks = []
    for norm, shapes in ((False, ROUTER_SHAPES), (True, NORM_ROUTER_SHAPES)):
        warps = moe_route.NORM_ROUTER_WARPS if norm else moe_route.ROUTER_WARPS
        for e, top_k, k, t in shapes:
            block_t, experts, block_k = moe_route.router_tiles(t, e, k)
            types = dict(x_ptr="*bf16", w_ptr="*bf16", bias_ptr="*bf16", logits_ptr="*fp32", weights_ptr="*fp32",
                         ids_ptr="*i32", counter_ptr="*i32")  # fmt: skip
            constexprs = dict(pdl, TOP_K=top_k, SCORING=0, RENORMALIZE=True, HAS_BIAS=True, BLOCK_T=block_t,
                              EXPERTS=experts, BLOCK_K=block_k, BLOCK_E=max(e, 2), SLOTS=top_k,
                              ROUTE_T=max(block_t, warps))  # fmt: skip
            if norm:
                types.update(res_ptr="*bf16", norm_w_ptr="*bf16", normed_ptr="*bf16", res_out_ptr="*bf16", eps="fp32")
                constexprs.update(NORM=True, BLOCK_H=1 << (k - 1).bit_length())
            name = f"router{'+norm' if norm else ''} E={e} top-{top_k} K={k} T={t}"
            checks.append((name, moe_route.router_route_kernel, types, constexprs, warps, False))
    return checks


def target_checks() -> int:
    """--targets (module docstring): the router, the alignment and both launches at each default bucket
    for every target; the unexpected failures."""
    failures = 0
    for target, family in TARGETS:
        pdl = dict(PDL=target.backend == "cuda" and target.arch >= 90)  # as launch.pdl_launch sets it
        checks = router_checks(pdl)
        for e, top_k, scoring in ((128, 8, 0), (256, 8, 1), (32, 4, 0)):
            checks.append((f"route E={e} top-{top_k}", moe_route.moe_route_kernel, dict(logits_ptr="*bf16", weights_ptr="*fp32", ids_ptr="*i32"),
                           dict(pdl, TOP_K=top_k, SCORING=scoring, RENORMALIZE=True, ROWS=4096 // e, BLOCK_E=e, BLOCK_K=top_k), 4, False))  # fmt: skip
            align_types = dict(ids_ptr="*i32", counts_ptr="*i32", sorted_ids_ptr="*i32", block_expert_ptr="*i32")
            steps = dict(STEP=moe_align.STEP, COUNT_STEP=moe_align.COUNT_STEP, TILE=moe_align.TILE)
            checks.append((f"align counts E={e}", moe_align.moe_count_kernel, align_types,
                           dict(pdl, BLOCK_E=e, STEP=moe_align.COUNT_STEP), moe_align.RANGE_WARPS, False))  # fmt: skip
            for counted, block_m in ((False, 16), (True, 64), (True, 128)):
                checks.append((f"align E={e} BLOCK_M={block_m}{' counted' if counted else ''}", moe_align.moe_align_kernel,
                               align_types, dict(steps, **pdl, COUNTED=counted, BLOCK_E=e, BLOCK_M=block_m),
                               moe_align.RANGE_WARPS if counted else moe_align.SINGLE_WARPS, False))  # fmt: skip
        for kind in KINDS:
            a_bytes, b_bytes = OPERAND_BYTES[kind]
            for rows in BUCKETS:
                moe = fit_moe_tiles(default_moe_tiles(rows, family, kind), kind, a_bytes, b_bytes, family)
                for gated, tiles in ((True, moe.w13), (False, moe.w2)):
                    name = f"{kind} {'w13' if gated else 'w2'} default {rows} {tiles.block_m}x{tiles.block_n}x{tiles.block_k}"
                    checks.append((name, *moe_signature(kind, gated, tiles, {}, target), tiles.num_warps,
                                   kind == "fp8_block"))  # fmt: skip
        failures += run_checks(checks, target)
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="also every tile of the H200 table")
    parser.add_argument("--targets", action="store_true", help="also the router and alignment, and sm80 / gfx942")
    args = parser.parse_args(argv)
    bad = target_checks() if args.targets else 0
    for name, fn, types, constexprs, num_warps, _ in router_checks(dict(PDL=True)):  # sm90: built, and spills?
        result = sass_status(lambda: compile_kernel(fn, SM90, types, constexprs, num_warps))  # noqa: B023
        bad += result != "ok"
        print(f"{name}: {result}", flush=True)
    for kind, gated, tiles, variant, label in cases(args.all):
        result = build(kind, gated, tiles, variant)
        bad += result.startswith("error") or (result == "spills" and not variant)
        shape = f"{tiles.block_m}x{tiles.block_n}x{tiles.block_k} w{tiles.num_warps} s{tiles.num_stages}"
        extra = ",".join(f"{k}={v}" for k, v in variant.items())
        print(f"{kind:9s} {'w13' if gated else 'w2':3s} {label:22s} {shape:22s} {extra:24s}: {result}", flush=True)
    print(f"{bad} builds fail or spill by default")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
