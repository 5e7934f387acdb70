"""The Hopper int4 tensor-core GEMM (kernels/gemm_w4_sm90.py) at M = 1..64 (and beyond: its row blocks of 128,
against today's dequantize-then-GEMM as "portable") on Llama-3-8B layer shapes,
per plan (rows a program, K splits, prefetch), beside the portable kernels that gemm() runs today and
bf16 torch.matmul in the same run (CUDA-graph replay, triton.testing.do_bench_cudagraph); every output
checked against the float32 product with the dequantized weight. Each timed call reads its weight cold in
L2, as a model's step does (scripts/cold_l2.py: the calls rotate through copies of the weight;
--warm-l2 times one copy, the sessions-9-to-19 figures). On the GPU:

    python experiments/quant4/gemm_sm90/sweep.py OUT.json [--ms 2 4 16 64] [--plans auto auto_sa 64:4:1 256:2:1:16 ...]

(auto: the default plan, scale applied after each step's MMA at M <= 32 for int4 g128; auto_sa / auto_nosa:
the default plan with that mode forced on / off at every M; a fifth plan field of 1 turns it on for an
explicit plan; auto_async / auto_sync: the default plan with the asynchronous MMA at every M / nowhere)
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

from scripts.cold_l2 import copies, rotate  # noqa: E402
from tritonllm.kernels import gemm as g  # noqa: E402
from tritonllm.kernels import gemm_w4_sm90, reference  # noqa: E402
from tritonllm.kernels.quant_formats import FP4, INT4, QuantScheme  # noqa: E402
from tritonllm.quantization.quantize import quantize_weight  # noqa: E402

SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--ms", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--group", type=int, default=128, help="int4 group size (ignored with --mxfp4)")
    parser.add_argument("--mxfp4", action="store_true", help="MXFP4 weights (e2m1, e8m0 per 32) instead of int4")
    parser.add_argument("--plans", nargs="+", default=["auto", "64:4:1", "64:2:1", "64:1:1", "128:4:1:8", "128:1:1:8",
                                                       "256:2:1:16", "256:1:1:16"],
                        help="BLOCK_N:SPLIT:PREFETCH[:WARPS] (auto: gemm_w4_sm90.plan)")  # fmt: skip
    parser.add_argument("--warm-l2", action="store_true", help="time one weight copy (L2-warm where it fits)")
    args = parser.parse_args()
    scheme = QuantScheme(FP4, "mx", "none") if args.mxfp4 else QuantScheme(INT4, "group", "none", group_size=args.group)
    rows = []
    for layer, n, k in SHAPES:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        q = quantize_weight(w.float(), scheme)
        w_deq = reference.dequantize_weight(q)
        weight_bytes = q.data.numel() + (1 if args.mxfp4 else 2) * q.scale.numel() * q.scale.element_size()
        w_copies, q_copies = copies(w, not args.warm_l2), copies(q, not args.warm_l2)  # one set a layer, every M
        for m in args.ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            expected = x.float() @ w_deq.T

            def w4(mode, x=x):
                return lambda wq: lambda: g.gemm(x, wq.data, b_scale=wq.scale, b_zero=wq.zeros, sm90=mode,
                                                **g.scale_args(scheme))  # fmt: skip

            bf16 = triton.testing.do_bench_cudagraph(rotate(lambda wb, x=x: lambda: x @ wb.T, w_copies))
            portable = triton.testing.do_bench_cudagraph(rotate(w4("never"), q_copies))
            line = f"{layer} {n}x{k} M={m}: bf16 {bf16 * 1e3:.1f}us portable {portable * 1e3:.1f}us ({bf16 / portable:.2f}x)"
            for spec in args.plans if m > 1 else ["gemv"]:
                gemm_w4_sm90.PLAN_OVERRIDE = (
                    None
                    if spec in ("auto", "auto_sa", "auto_nosa", "auto_async", "auto_sync", "gemv")
                    else gemm_w4_sm90.Plan.parse(spec)
                )
                gemm_w4_sm90.SCALE_AFTER = {"auto_sa": "1", "auto_nosa": "0"}.get(spec, "auto")
                gemm_w4_sm90.ASYNC_MMA = {"auto_async": "1", "auto_sync": "0"}.get(spec, "auto")
                call = rotate(w4("always"), q_copies)  # every copy run once under this plan before the capture
                got = call()
                err = ((got.float() - expected).abs().max() / expected.abs().max()).item()
                us = triton.testing.do_bench_cudagraph(call)
                p = gemm_w4_sm90.plan(m, n, k, args.mxfp4)
                rows.append(dict(layer=layer, n=n, k=k, m=m, group=32 if args.mxfp4 else args.group, plan=spec,
                                 format="mxfp4" if args.mxfp4 else "int4",
                                 resolved=dataclasses.asdict(p), us=us * 1e3, bf16_us=bf16 * 1e3, l2="warm" if args.warm_l2 else "cold",
                                 portable_us=portable * 1e3, speedup_vs_bf16=bf16 / us,
                                 tb_s=weight_bytes / us / 1e9, rel_err=err))  # fmt: skip
                line += f" | {spec} {us * 1e3:.1f}us {bf16 / us:.2f}x err {err:.1e}"
            gemm_w4_sm90.PLAN_OVERRIDE, gemm_w4_sm90.SCALE_AFTER, gemm_w4_sm90.ASYNC_MMA = None, "auto", "auto"
            print(line, flush=True)
            args.out.write_text(json.dumps(rows, indent=1))  # as it goes: a run cut short keeps what it measured


if __name__ == "__main__":
    main()
