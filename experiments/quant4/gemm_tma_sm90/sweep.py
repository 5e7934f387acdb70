"""The Hopper W4 GEMM with the weight streamed by TMA (kernels/gemm_w4_tma_sm90.py) at M = 1..64 on
Llama-3-8B layer shapes, per plan (rows a program, K splits, stages, warps), beside what gemm() runs
without it (the pointer-loading Gluon GEMV at M = 1, GEMM above) and bf16 torch.matmul in the same run
(CUDA-graph replay, triton.testing.do_bench_cudagraph); every output checked against the float32 product
with the dequantized weight. On the GPU:

    python experiments/quant4/gemm_tma_sm90/sweep.py OUT.json [--ms 1 16] [--mxfp4] [--group 32]
        [--plans auto 64:4:8 128:1:8 ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tritonllm.kernels import gemm as g  # noqa: E402
from tritonllm.kernels import gemm_w4_tma_sm90 as tma  # noqa: E402
from tritonllm.kernels import reference  # noqa: E402
from tritonllm.kernels.quant_formats import FP4, INT4, QuantScheme  # noqa: E402
from tritonllm.quantization.quantize import quantize_weight  # noqa: E402

SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--ms", nargs="+", type=int, default=[1, 2, 4, 16, 32, 64])
    parser.add_argument("--group", type=int, default=128, help="int4 group size (ignored with --mxfp4)")
    parser.add_argument("--mxfp4", action="store_true", help="MXFP4 weights (e2m1, e8m0 per 32) instead of int4")
    parser.add_argument("--layers", nargs="+", default=[s[0] for s in SHAPES])
    parser.add_argument("--plans", nargs="+", default=["auto", "64:2:4", "64:4:4", "128:1:4", "128:1:8"],
                        help="BLOCK_N:SPLIT[:STAGES[:WARPS]] (auto: gemm_w4_tma_sm90.plan)")  # fmt: skip
    args = parser.parse_args()
    scheme = QuantScheme(FP4, "mx", "none") if args.mxfp4 else QuantScheme(INT4, "group", "none", group_size=args.group)
    rows = []
    for layer, n, k in SHAPES:
        if layer not in args.layers:
            continue
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        q = quantize_weight(w.float(), scheme)
        w_deq = reference.dequantize_weight(q)
        weight_bytes = q.data.numel() + q.scale.numel() * q.scale.element_size() * (1 if args.mxfp4 else 2)
        for m in args.ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            expected = x.float() @ w_deq.T

            def call(x=x, q=q):
                return g.gemm(x, q.data, b_scale=q.scale, b_zero=q.zeros, sm90="faster", **g.scale_args(scheme))

            bf16 = triton.testing.do_bench_cudagraph(lambda x=x, w=w: x @ w.T)
            tma.FORCE = "never"
            before = triton.testing.do_bench_cudagraph(call)
            line = f"{layer} {n}x{k} M={m}: bf16 {bf16 * 1e3:.1f}us pointer {before * 1e3:.1f}us ({bf16 / before:.2f}x)"
            tma.FORCE = "always"
            for spec in args.plans:
                tma.PLAN_OVERRIDE = None if spec == "auto" else tma.Plan.parse(spec)
                p = tma.plan(m, n, k, args.mxfp4)
                if tma.smem_bytes(p, tma.block_m(m), args.mxfp4, 32 if args.mxfp4 else args.group) > 227 * 1024:
                    continue
                got = call()
                err = ((got.float() - expected).abs().max() / expected.abs().max()).item()
                us = triton.testing.do_bench_cudagraph(call)
                rows.append(dict(layer=layer, n=n, k=k, m=m, group=32 if args.mxfp4 else args.group, plan=spec,
                                 format="mxfp4" if args.mxfp4 else "int4", resolved=dataclasses.asdict(p),
                                 us=us * 1e3, bf16_us=bf16 * 1e3, pointer_us=before * 1e3,
                                 speedup_vs_bf16=bf16 / us, speedup_vs_pointer=before / us,
                                 tb_s=weight_bytes / us / 1e9, rel_err=err))  # fmt: skip
                line += f" | {spec} {us * 1e3:.1f}us {bf16 / us:.2f}x err {err:.1e}"
            tma.PLAN_OVERRIDE = None
            tma.FORCE = ""
            print(line, flush=True)
            args.out.write_text(json.dumps(rows, indent=1))  # as it goes: a run cut short keeps what it measured


if __name__ == "__main__":
    main()
