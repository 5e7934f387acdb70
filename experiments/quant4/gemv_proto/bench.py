"""On the GPU: the prototype 4-bit GEMVs beside bf16 cuBLAS and the current gemm() path at M = 1,
Llama-3-8B layer shapes; every timing checked against the dequantized float32 reference.
    python experiments/quant4/gemv_proto/bench.py OUT.json"""
import itertools
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
from check_cpu import make  # noqa: E402
from kernels import VARIANTS, w4_gemv_proto  # noqa: E402

from tritonllm.kernels import gemm as g  # noqa: E402
from tritonllm.kernels.quant_formats import FP4, INT4, QuantizedWeight, QuantScheme  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
CONFIGS = [(16, 64, 4), (32, 64, 4), (32, 32, 4), (64, 32, 4), (16, 128, 4), (32, 128, 8), (64, 64, 8), (128, 32, 8), (64, 32, 8)]
SPLITS = (2, 4, 8, 16)
# a shorter run: GEMV_PROTO_CONFIGS="16,128,4 32,64,4" GEMV_PROTO_SPLITS="1 2"
if os.environ.get("GEMV_PROTO_CONFIGS"):
    CONFIGS = [tuple(int(v) for v in c.split(",")) for c in os.environ["GEMV_PROTO_CONFIGS"].split()]
if os.environ.get("GEMV_PROTO_SPLITS"):
    SPLITS = tuple(int(v) for v in os.environ["GEMV_PROTO_SPLITS"].split())
DEV = "cuda" if torch.cuda.is_available() else "cpu"
if DEV == "cpu":  # a dry run of the script under the interpreter
    SHAPES = {"small": (48, 1024)}
    CONFIGS = [(16, 32, 4), (16, 128, 4)]
    SPLITS = (1, 2)


def us(fn):
    fn()
    if DEV == "cpu":
        return 1.0
    return triton.testing.do_bench_cudagraph(fn, rep=20) * 1000


def main():
    out_path = sys.argv[1]
    gen = torch.Generator().manual_seed(0)
    rows = []
    for (layer, (n, k)), fp4 in itertools.product(SHAPES.items(), (False, True)):
        group = 32 if fp4 else 128
        packed, s, z, w = make(n, k, fp4, group, gen)
        packed, s, w = packed.to(DEV), s.to(DEV), w.to(DEV)
        z = z.to(DEV) if z is not None else None
        x = torch.randn(1, k, generator=gen).to(torch.bfloat16 if DEV == "cuda" else torch.float16).to(DEV)
        ref = (w @ x.float().t()).squeeze(1)
        scale = ref.abs().max()
        wb = w.to(x.dtype)
        base = dict(layer=layer, n=n, k=k, fmt="mxfp4" if fp4 else "int4")
        cublas = us(lambda: torch.matmul(x, wb.t()))
        rows.append(dict(base, impl="cublas_bf16", us=cublas))
        scheme = QuantScheme(FP4, "mx", "none") if fp4 else QuantScheme(INT4, "group", "none", group_size=128)
        qw = QuantizedWeight(scheme, packed, s, zeros=z)
        cur = lambda: g.gemm(x, qw.data, None, out_dtype=x.dtype, b_scale=qw.scale, b_zero=qw.zeros, **g.scale_args(scheme))  # noqa: E731
        err = float((cur().float().squeeze(0) - ref).abs().max() / scale)
        rows.append(dict(base, impl="gemm_current", us=us(cur), err=err))
        words = packed.view(torch.int32)
        c = torch.zeros(n, dtype=torch.float32, device=DEV)
        for (name, split_act), (bn, bw, nw), split, pf in itertools.product(VARIANTS.items(), CONFIGS, SPLITS, (False, True)):
            if (k // 8) % (bw * split) or bw * 8 < group:
                continue
            def call(split_act=split_act, bn=bn, bw=bw, nw=nw, split=split, pf=pf):
                c.zero_()
                w4_gemv_proto[(triton.cdiv(n, bn), split)](x, words, s, z if z is not None else s, c, n, k, k // split,
                                                words.stride(0), s.stride(0), FP4=fp4, GROUP=group, BLOCK_N=bn,
                                                BLOCK_W=bw, SPLIT_ACT=split_act, PREFETCH=pf, num_warps=nw, num_stages=2)
            try:
                call()
                err = float((c - ref).abs().max() / scale)
                t = us(call)
            except Exception as e:  # noqa: BLE001
                print("fail", name, bn, bw, nw, split, str(e)[:100])
                continue
            rows.append(dict(base, impl=name + ("_pf" if pf else ""), bn=bn, bw=bw, warps=nw, split=split, us=t, err=err))
        mine = [r for r in rows if r["layer"] == layer and r["fmt"] == base["fmt"]]
        for impl in ("gemm_current", "w4_gemv_strided", "w4_gemv_strided_pf", "w4_gemv_split", "w4_gemv_split_pf"):
            cand = [r for r in mine if r["impl"] == impl]
            best = min(cand, key=lambda r: r["us"])
            gbps = (n * k / 2 + n * k // group * (1 if fp4 else 4)) / best["us"] / 1e3
            print(f"{layer:8s} {base['fmt']:6s} {impl:16s} {best['us']:7.2f} us  {cublas / best['us']:.2f}x cuBLAS "
                  f"({cublas:.1f} us)  {gbps:.0f} GB/s  err {best.get('err', 0):.1e}  "
                  f"{ {k_: best.get(k_) for k_ in ('bn', 'bw', 'warps', 'split')} }", flush=True)
    json.dump(rows, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"{time.time() - t0:.0f} s")
