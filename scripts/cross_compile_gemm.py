"""Compile the GEMM family and the quantization kernels for NVIDIA sm90 / sm80 and AMD gfx942
without any GPU: every kernel kind (bf16, FP8 and int8 W8A8, block-FP8, MXFP8 with operand
scales, FP8/int8 weight-only) at each M bucket's tiles of that GPU family's table, the split-K
reduction, activation quantization (per token, per group, MX) and the RMSNorm / SiLU-mul kernels
with quantization fused in. One source for CUDA and ROCm: FP8 is e4m3fn on NVIDIA, e4m3fnuz on
MI300. sm80 has no FP8: its FP8 variants are expected to fail; there the engine runs FP8
checkpoints weight-only from the weight's bytes (the e4m3fn-bytes variant, which must build). Reports spills (local memory in the PTX) on NVIDIA.

    python scripts/cross_compile_gemm.py     # a few minutes on a laptop CPU
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # before tritonllm.platform, which would switch it on without a GPU

# isort: split
import triton.language as tl
from cross_compile_attention import compile_kernel  # this folder: sys.path[0] when run as a script
from triton.backends.compiler import GPUTarget

from tritonllm.kernels import activation, gemm, gemm_gemv, gemm_persistent, gemv_w4, quant, rmsnorm

TARGETS = [
    (GPUTarget("cuda", 90, 32), "hopper"),
    (GPUTarget("cuda", 80, 32), "ampere"),
    (GPUTarget("hip", "gfx942", 64), "cdna"),
]

# the pointer-kernel GEMM's and the GEMV's output, bias and scale pointers (their A / B types vary per case)
OUT_AND_SCALE_PTRS = dict(
    c_ptr="*bf16", bias_ptr="*bf16", a_scale_ptr="*fp32", b_scale_ptr="*fp32", b_zero_ptr="*fp32", ws_ptr="*fp32"
)


def _gemm_variants(fp8: str) -> list[tuple[str, str, dict, dict]]:
    """(name, table kind, pointer types, constexprs) of each GEMM kind the linear implementations launch."""
    base = dict(A_SCALE=0, B_SCALE=0, GROUP_K=1, GROUP_N=1, E8M0=False, UPCAST_B=False, INT_ACC=False, HAS_BIAS=True,
                IEEE=False, OPERAND_SCALES=False, DOT_DTYPE=tl.bfloat16, B_E4M3FN_BITS=False, B_DECODE=0,
                EVEN_K=True, SPLIT_K=1)  # fmt: skip
    row_col = dict(base, A_SCALE=2, B_SCALE=2)
    fp32_scales = dict(a_scale_ptr="*fp32", b_scale_ptr="*fp32")
    return [
        ("bf16", "float", dict(a_ptr="*bf16", b_ptr="*bf16"), base),
        ("fp8 w8a8", "w8a8", dict(a_ptr=f"*{fp8}", b_ptr=f"*{fp8}", **fp32_scales), row_col),
        ("int8 w8a8", "w8a8", dict(a_ptr="*i8", b_ptr="*i8", **fp32_scales), dict(row_col, INT_ACC=True)),
        ("fp8 block-128", "block", dict(a_ptr=f"*{fp8}", b_ptr=f"*{fp8}", **fp32_scales),
         dict(base, A_SCALE=3, B_SCALE=3, GROUP_K=128, GROUP_N=128)),
        ("mxfp8", "float", dict(a_ptr=f"*{fp8}", b_ptr=f"*{fp8}", a_scale_ptr="*u8", b_scale_ptr="*u8"),
         dict(base, A_SCALE=3, B_SCALE=3, GROUP_K=32, E8M0=True, OPERAND_SCALES=True)),
        ("fp8 weight-only", "weight_only", dict(a_ptr="*bf16", b_ptr=f"*{fp8}", **fp32_scales),
         dict(base, B_SCALE=2, UPCAST_B=True)),
        # GPUs without FP8 (sm80): e4m3fn weights as bytes, decoded with integer arithmetic
        ("e4m3fn-bytes weight-only", "weight_only", dict(a_ptr="*bf16", b_ptr="*u8", **fp32_scales),
         dict(base, B_SCALE=2, UPCAST_B=True, B_E4M3FN_BITS=True)),
        ("int8 weight-only", "weight_only", dict(a_ptr="*bf16", b_ptr="*i8", **fp32_scales),
         dict(base, B_SCALE=2, UPCAST_B=True)),
        # W4A16: int4 pairs a byte, per-128-column scales and zero points; MXFP4 e2m1 pairs, e8m0 per 32
        ("int4 weight-only", "w4a16", dict(a_ptr="*bf16", b_ptr="*u8", **fp32_scales),
         dict(base, B_SCALE=3, GROUP_K=128, UPCAST_B=True, B_DECODE=1)),
        ("mxfp4 weight-only", "w4a16", dict(a_ptr="*bf16", b_ptr="*u8", a_scale_ptr="*fp32", b_scale_ptr="*u8"),
         dict(base, B_SCALE=3, GROUP_K=32, UPCAST_B=True, B_DECODE=3, E8M0=True)),
        # W8A16 with groups narrower than a K tile (GGUF Q6_K: 16 columns), fp16 scales
        ("uint8 g16 weight-only", "weight_only", dict(a_ptr="*bf16", b_ptr="*u8", **fp32_scales),
         dict(base, B_SCALE=3, GROUP_K=16, UPCAST_B=True, B_DECODE=2)),
        ("bf16 split-K", "float", dict(a_ptr="*bf16", b_ptr="*bf16"), dict(base, SPLIT_K=4, EVEN_K=False)),
    ]  # fmt: skip


def _report(fn, target, types, constexprs, num_warps) -> str | None:
    try:
        kernel = compile_kernel(fn, target, types, constexprs, num_warps=num_warps)
    except Exception as error:  # noqa: BLE001 - reported, not raised
        return str(error).splitlines()[0][:200]
    ptx = kernel.asm.get("ptx", "")
    if target.backend == "cuda" and "ld.local" in ptx:
        return "spills to local memory"
    if fn is gemm_persistent.gemm_persistent_kernel and target.arch == 90:
        if "cp.async.bulk.tensor" not in ptx or "wgmma" not in ptx:
            return "no TMA loads or no wgmma on sm90"
    return None


def main() -> int:
    failures = 0
    for target, family in TARGETS:
        fp8 = "fp8e4nv" if target.backend == "cuda" else "fp8e4b8"
        checks = []
        for name, kind, types, constexprs in _gemm_variants(fp8):
            for max_m, tiles in gemm.GEMM_TABLES[family][kind]:
                a_bytes = 2 if types["a_ptr"] == "*bf16" else 1
                b_bytes = 2 if types["b_ptr"] == "*bf16" else 1
                t = gemm.fit_shared_memory(tiles, a_bytes, b_bytes, family)
                if constexprs["A_SCALE"] == 3 and not constexprs["OPERAND_SCALES"]:
                    t = gemm.replace(t, block_k=min(t.block_k, constexprs["GROUP_K"]))
                tile_constexprs = dict(
                    constexprs, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, GROUP_M=t.group_m
                )
                all_types = dict(OUT_AND_SCALE_PTRS, **types)
                checks.append((f"gemm {name} M<={max_m} {t.block_m}x{t.block_n}x{t.block_k}", gemm.gemm_kernel, all_types,
                               tile_constexprs, t.num_warps, "fp8" in name))  # fmt: skip
        for name, a_t, acc_int in (("bf16", "bf16", False), ("fp8", fp8, False), ("int8", "i8", True)):
            for bm, bn, bk, warps in ((128, 256, 64 if a_t == "bf16" else 128, 8), (128, 128, 64, 4)):
                desc = lambda dt, r, c: f"tensordesc<{dt}[{r}, {c}]>"  # noqa: E731
                types = dict(a_desc=desc(a_t, bm, bk), b_desc=desc(a_t, bn, bk), c_desc=desc("bf16", bm, bn),
                             bias_ptr="*bf16", a_scale_ptr="*fp32", b_scale_ptr="*fp32")  # fmt: skip
                scales = dict(A_SCALE=0, B_SCALE=0) if a_t == "bf16" else dict(A_SCALE=2, B_SCALE=2)
                constexprs = dict(scales, GROUP_N=1, INT_ACC=acc_int, HAS_BIAS=True, OUT_DTYPE=tl.bfloat16,
                                  NUM_PROGRAMS=132, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8)  # fmt: skip
                checks.append((f"gemm persistent {name} {bm}x{bn}x{bk}", gemm_persistent.gemm_persistent_kernel, types,
                               constexprs, warps, name == "fp8"))  # fmt: skip
                if name == "fp8":  # block-FP8 on the persistent kernel: 128-deep K tiles, one scale group each
                    block = dict(constexprs, A_SCALE=3, B_SCALE=3, GROUP_N=128, BLOCK_K=128)
                    types = dict(types, a_desc=desc(a_t, bm, 128), b_desc=desc(a_t, bn, 128))
                    checks.append((f"gemm persistent fp8 block-128 {bm}x{bn}x128", gemm_persistent.gemm_persistent_kernel,
                                   types, block, warps, True))  # fmt: skip
        # the GEMV kernel (decode-sized M): float, W8A8 row/column and block scales, weight-only bytes
        gemv_base = dict(A_SCALE=0, B_SCALE=0, GROUP_K=1, GROUP_N=1, INT_ACC=False, HAS_BIAS=True, B_E4M3FN_BITS=False,
                         B_DECODE=0, EVEN_K=True, SPLIT_K=1, BLOCK_N=32, BLOCK_K=256)  # fmt: skip
        for name, types, constexprs, uses_fp8 in (
            ("bf16", dict(a_ptr="*bf16", b_ptr="*bf16"), gemv_base, False),
            ("fp8 w8a8", dict(a_ptr=f"*{fp8}", b_ptr=f"*{fp8}"), dict(gemv_base, A_SCALE=2, B_SCALE=2, BLOCK_K=512), True),
            ("int8 w8a8", dict(a_ptr="*i8", b_ptr="*i8"), dict(gemv_base, A_SCALE=2, B_SCALE=2, INT_ACC=True), False),
            ("fp8 block-128 split-K", dict(a_ptr=f"*{fp8}", b_ptr=f"*{fp8}"),
             dict(gemv_base, A_SCALE=3, B_SCALE=3, GROUP_K=128, GROUP_N=128, BLOCK_K=128, SPLIT_K=4), True),
            ("e4m3fn-bytes weight-only", dict(a_ptr="*bf16", b_ptr="*u8"), dict(gemv_base, B_SCALE=2, B_E4M3FN_BITS=True), False),
            ("int4 weight-only split-K", dict(a_ptr="*bf16", b_ptr="*u8"),
             dict(gemv_base, B_SCALE=3, GROUP_K=128, B_DECODE=1, BLOCK_K=128, SPLIT_K=4), False),
            ("mxfp4 weight-only", dict(a_ptr="*bf16", b_ptr="*u8", b_scale_ptr="*u8"),
             dict(gemv_base, B_SCALE=3, GROUP_K=32, B_DECODE=3), False),
            ("uint8 g32 weight-only", dict(a_ptr="*bf16", b_ptr="*u8"), dict(gemv_base, B_SCALE=3, GROUP_K=32, B_DECODE=2), False),
        ):  # fmt: skip
            checks.append(
                (f"gemv {name}", gemm_gemv.gemv_kernel, dict(OUT_AND_SCALE_PTRS, **types), constexprs, 4, uses_fp8)
            )
        # the word GEMV of packed 4-bit weights (kernels/gemv_w4.py): one row and four rows a program; ROCm
        # takes the where-based e2m1 decode (FP4_BITS off)
        w4_base = dict(FP4=False, FP4_BITS=target.backend == "cuda", GROUP_K=128, HAS_BIAS=True, EVEN=True, SPLIT_K=1,
                       BLOCK_M=1, BLOCK_N=16, BLOCK_W=128)  # fmt: skip
        w4_types = dict(a_ptr="*bf16", w_ptr="*i32", c_ptr="*bf16", bias_ptr="*bf16", s_ptr="*fp16", z_ptr="*fp16",
                        ws_ptr="*fp32")  # fmt: skip
        for name, types, constexprs in (
            ("int4", w4_types, w4_base),
            ("int4 4 rows split-K", w4_types, dict(w4_base, BLOCK_M=4, SPLIT_K=4, EVEN=False)),
            ("mxfp4", dict(w4_types, s_ptr="*u8", z_ptr="*u8"), dict(w4_base, FP4=True, GROUP_K=32)),
            ("mxfp4 4 rows", dict(w4_types, s_ptr="*u8", z_ptr="*u8"), dict(w4_base, FP4=True, GROUP_K=32, BLOCK_M=4)),
        ):
            checks.append((f"gemv words {name}", gemv_w4.w4_gemv_kernel, types, constexprs, 4, False))
        checks.append(("split-K reduce", gemm.split_k_reduce_kernel, dict(ws_ptr="*fp32", c_ptr="*bf16", bias_ptr="*bf16"),
                       dict(SPLIT_K=4, HAS_BIAS=True, BLOCK=1024), 4, False))  # fmt: skip
        for q, qmax in ((fp8, 448.0 if target.backend == "cuda" else 240.0), ("i8", 127.0)):
            is_int, min_exp = q == "i8", -6 if target.backend == "cuda" else -7
            common = dict(QMAX=qmax, IS_INT=is_int, MIN_EXP=min_exp)
            checks += [
                (f"quant per token {q}", quant._quant_token_kernel, dict(x_ptr="*bf16", q_ptr=f"*{q}", s_ptr="*fp32"),
                 dict(common, STATIC=False, BLOCK=4096), 8, q != "i8"),
                (f"quant 1x128 {q}", quant._quant_group_kernel, dict(x_ptr="*bf16", q_ptr=f"*{q}", s_ptr="*fp32"),
                 dict(common, MX=False, GROUP=128, GROUPS=8), 4, q != "i8"),
                (f"rms_norm_quant {q}", rmsnorm._rms_norm_kernel,
                 dict(x_ptr="*bf16", residual_ptr="*bf16", weight_ptr="*bf16", out_ptr=f"*{q}", residual_out_ptr="*bf16",
                      eps="fp32", q_ptr=f"*{q}", scale_ptr="*fp32"),
                 dict(common, HAS_RESIDUAL=True, BLOCK_ROWS=1, BLOCK_H=4096, QUANT=True, STATIC=False), 8, q != "i8"),
                (f"silu_and_mul_quant {q}", activation._silu_and_mul_quant_kernel,
                 dict(x_ptr="*bf16", q_ptr=f"*{q}", scale_ptr="*fp32"),
                 dict(common, STATIC=False, BLOCK_ROWS=1, BLOCK_D=16384), 16, q != "i8"),
            ]  # fmt: skip
        checks.append(("quant MX", quant._quant_group_kernel, dict(x_ptr="*bf16", q_ptr=f"*{fp8}", s_ptr="*u8"),
                       dict(QMAX=448.0, IS_INT=False, MIN_EXP=-6, MX=True, GROUP=32, GROUPS=32), 4, True))  # fmt: skip
        failures += run_checks(checks, target)
    return failures


def run_checks(checks: list[tuple], target: GPUTarget) -> int:
    """Compile each (name, kernel, types, constexprs, num_warps, uses_fp8) check for `target` and print
    its status; returns the unexpected failures (FP8 variants are expected to fail on sm80)."""
    failures = 0
    for name, fn, types, constexprs, num_warps, uses_fp8 in checks:
        error = _report(fn, target, types, constexprs, num_warps)
        expected = error is not None and uses_fp8 and target.arch == 80
        failures += error is not None and not expected
        status = "ok" if error is None else ("expected failure (no FP8)" if expected else f"FAILED: {error}")
        print(f"{target.backend} {target.arch} {name}: {status}", flush=True)
    return failures


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
