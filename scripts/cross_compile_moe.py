"""Compile the MoE kernels (kernels/moe_route.py, moe_align.py, moe.py) for NVIDIA sm90 / sm80 and AMD
gfx942 without any GPU: the router at Qwen3 / DeepSeek / gpt-oss expert counts, the alignment (one
program counting itself, and the counted multi-program path) at those counts, and the grouped
GEMM's w13 (gated, with the activation) and w2 launches for bf16, FP8 block-128 and MXFP4 experts at
every default tile bucket of that GPU family (kernels/moe_tiles.py). sm80 has no FP8: its FP8
variants are expected to fail. Reports spills (local memory in the PTX) on NVIDIA.

    python scripts/cross_compile_moe.py
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # before tritonllm.platform, which would switch it on without a GPU

# isort: split
from cross_compile_gemm import TARGETS, run_checks  # this folder: sys.path[0] when run as a script

from tritonllm.kernels import moe, moe_align, moe_gemv, moe_route, moe_tiles


def main() -> int:
    failures = 0
    for target, family in TARGETS:
        fp8 = "fp8e4nv" if target.backend == "cuda" else "fp8e4b8"
        checks = []
        for e, top_k, scoring in ((128, 8, 0), (256, 8, 1), (32, 4, 0)):
            checks.append((f"route E={e} top-{top_k}", moe_route.moe_route_kernel, dict(logits_ptr="*bf16", weights_ptr="*fp32", ids_ptr="*i32"),
                           dict(TOP_K=top_k, SCORING=scoring, RENORMALIZE=True, ROWS=4096 // e, BLOCK_E=e, BLOCK_K=top_k), 4, False))  # fmt: skip
            align_types = dict(ids_ptr="*i32", counts_ptr="*i32", sorted_ids_ptr="*i32", block_expert_ptr="*i32")
            steps = dict(STEP=moe_align.STEP, COUNT_STEP=moe_align.COUNT_STEP, TILE=moe_align.TILE)
            checks.append((f"align counts E={e}", moe_align.moe_count_kernel, align_types,
                           dict(BLOCK_E=e, STEP=moe_align.COUNT_STEP), moe_align.RANGE_WARPS, False))  # fmt: skip
            for counted, block_m in ((False, 16), (True, 64), (True, 128)):
                checks.append((f"align E={e} BLOCK_M={block_m}{' counted' if counted else ''}", moe_align.moe_align_kernel,
                               align_types, dict(steps, COUNTED=counted, BLOCK_E=e, BLOCK_M=block_m),
                               moe_align.RANGE_WARPS if counted else moe_align.SINGLE_WARPS, False))  # fmt: skip
        kinds = [
            ("bfloat16", dict(a_ptr="*bf16", b_ptr="*bf16"), dict(QUANT=moe.Q_NONE, GROUP_K=1), 2, 2),
            ("fp8_block", dict(a_ptr=f"*{fp8}", b_ptr=f"*{fp8}", a_scale_ptr="*fp32", b_scale_ptr="*fp32"),
             dict(QUANT=moe.Q_FP8_BLOCK, GROUP_K=128), 1, 1),
            ("mxfp4", dict(a_ptr="*bf16", b_ptr="*u8", b_scale_ptr="*u8"), dict(QUANT=moe.Q_MXFP4, GROUP_K=32), 2, 1),
        ]  # fmt: skip
        for kind, types, quant, a_bytes, b_bytes in kinds:
            for rows in (1, 16, 64, 1024):
                tiles = moe_tiles.fit_moe_tiles(
                    moe_tiles.default_moe_tiles(rows, family), kind, a_bytes, b_bytes, family
                )
                for gemm_name, t, gated in (("w13", tiles.w13, True), ("w2", tiles.w2, False)):
                    all_types = dict(dict(c_ptr="*bf16", bias_ptr="*bf16", a_scale_ptr="*fp32", b_scale_ptr="*fp32",
                                          topk_weights_ptr="*fp32", sorted_ids_ptr="*i32", block_expert_ptr="*i32",
                                          alpha="fp32", limit="fp32"), **types)  # fmt: skip
                    constexprs = dict(quant, A_ROW_DIV=8 if gated else 1, GATED=gated, ACTIVATION=1, HAS_BIAS=True,
                                      MUL_WEIGHTS=not gated, IEEE=False, EVEN_K=True, BLOCK_M=t.block_m,
                                      BLOCK_N=t.block_n, BLOCK_K=t.block_k, GROUP_M=t.group_m)  # fmt: skip
                    name = f"moe {kind} {gemm_name} rows/expert {rows} {t.block_m}x{t.block_n}x{t.block_k}"
                    checks.append((name, moe.fused_moe_kernel, all_types, constexprs, t.num_warps, kind == "fp8_block"))
            # the GEMV path (kernels/moe_gemv.py) at decode sizes; MXFP4 also read as int32 words (gemv_w4.py)
            for words in (False, True) if kind == "mxfp4" else (False,):
                gemv_types = dict(
                    dict(c_ptr="*bf16", bias_ptr="*bf16", a_scale_ptr="*fp32", b_scale_ptr="*fp32",
                         topk_weights_ptr="*fp32", topk_ids_ptr="*i32", alpha="fp32", limit="fp32"),
                    **dict(types, **(dict(b_ptr="*i32") if words else {})),
                )  # fmt: skip
                for gemm_name, gated in (("w13", True), ("w2", False)):
                    constexprs = dict(quant, A_ROW_DIV=8 if gated else 1, GATED=gated, ACTIVATION=1, HAS_BIAS=True,
                                      MUL_WEIGHTS=not gated, EVEN_K=False, BLOCK_N=16, BLOCK_K=512 if a_bytes == 2 else 128,
                                      WORDS=words, FP4_BITS=target.backend == "cuda")  # fmt: skip
                    name = f"moe gemv {kind}{' words' if words else ''} {gemm_name}"
                    checks.append((name, moe_gemv.moe_gemv_kernel, gemv_types, constexprs, 4, kind == "fp8_block"))
        failures += run_checks(checks, target)
    return failures


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
