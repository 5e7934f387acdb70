"""The Hopper Gluon W4 GEMV (kernels/gemv_w4_sm90.py) at M = 1 on Llama-3-8B layer shapes, per
(rows a program, register cap), beside the portable word GEMV and bf16 torch.matmul in the same run
(CUDA-graph replay timing, triton.testing.do_bench_cudagraph). Each timed call reads its weight cold in
L2, as a model's step does (scripts/cold_l2.py; --warm-l2: one weight copy, how sessions 12-19 timed). On the GPU:

    python experiments/quant4/gemv_sm90/sweep.py OUT.json [--configs 8:4:0:0 4:1:1:0 ...]
        (ROWS:WARPS_K:PREFETCH:MAXNREG[:BLOCKS[:SPLIT]], gemv_w4_sm90.Tiling.parse)
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
from tritonllm.kernels import gemv_w4_sm90, reference  # noqa: E402
from tritonllm.kernels.quant_formats import FP4, INT4, QuantScheme  # noqa: E402
from tritonllm.quantization.quantize import quantize_weight  # noqa: E402

SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]
SCHEMES = {"int4_g128": QuantScheme(INT4, "group", "none", group_size=128), "mxfp4": QuantScheme(FP4, "mx", "none")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--configs", nargs="+", default=["8:4:0:0", "4:4:0:0", "4:4:0:128", "4:1:1:0", "2:1:1:0"],
                        help="ROWS:WARPS_K:PREFETCH:MAXNREG[:BLOCKS[:SPLIT]] (MAXNREG 0: no cap)")  # fmt: skip
    parser.add_argument("--warm-l2", action="store_true", help="time one weight copy (L2-warm where it fits)")
    args = parser.parse_args()
    cold = not args.warm_l2
    configs = [gemv_w4_sm90.Tiling.parse(c) for c in args.configs]
    rows = []
    for layer, n, k in SHAPES:
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        bf16 = triton.testing.do_bench_cudagraph(rotate(lambda wb, x=x: lambda: x @ wb.T, copies(w, cold)))
        for fmt, scheme in SCHEMES.items():
            q = quantize_weight(w.float(), scheme)
            expected = x.float() @ reference.dequantize_weight(q).T

            def call(q=q, x=x, scheme=scheme, gluon="always"):
                return g.gemm(x, q.data, b_scale=q.scale, b_zero=q.zeros, sm90=gluon, **g.scale_args(scheme))

            weights = copies(q, cold)
            portable = triton.testing.do_bench_cudagraph(
                rotate(lambda wq, call=call: lambda: call(wq, gluon="never"), weights)
            )
            weight_bytes = q.data.numel() + q.scale.numel() * q.scale.element_size() * (2 if q.zeros is not None else 1)
            line = f"{layer} {n}x{k} {fmt}: bf16 {bf16 * 1e3:.1f}us portable {portable * 1e3:.1f}us ({bf16 / portable:.2f}x)"
            for tiling in configs:
                gemv_w4_sm90.TILINGS = {"int4": tiling, "fp4": tiling}
                got = call()
                err = ((got.float() - expected).abs().max() / expected.abs().max()).item()
                us = triton.testing.do_bench_cudagraph(rotate(lambda wq, call=call: lambda: call(wq), weights))
                rows.append(dict(layer=layer, n=n, k=k, format=fmt, tiling=dataclasses.asdict(tiling), us=us * 1e3,
                                 l2="warm" if args.warm_l2 else "cold",
                                 bf16_us=bf16 * 1e3,
                                 portable_us=portable * 1e3, speedup_vs_bf16=bf16 / us, tb_s=weight_bytes / us / 1e9,
                                 rel_err=err))  # fmt: skip
                line += f" | {tiling.spec()} {us * 1e3:.1f}us {bf16 / us:.2f}x {weight_bytes / us / 1e9:.2f}TB/s err {err:.1e}"
            print(line, flush=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
