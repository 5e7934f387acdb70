"""Can the 4-bit prefill's dequantize pass hide under the GEMMs? Llama-3-8B layers (qkv, o, gate_up, down; int4
g128 or MXFP4), M = prefill rows, the linears of several layers in model order.

Today a 4-bit linear beyond gemm_w4_sm90.MAX_M rows dequantizes its weight to bf16 (one memory-bound pass:
0.5 bytes a weight read, 2 written) and then runs the float GEMM on it (compute-bound at M = 512: the weight
read is ~45% of HBM's rate). Both on one stream, the pass adds its whole time (session 38, H100, int4 M = 512:
624 us a layer against bf16 cuBLAS's 337, 200 of them the pass). Here the next linear's pass runs on a side
stream while this linear's GEMM runs (the GEMM's CTAs leave registers and shared memory for the pass's), so
the pass takes the HBM bandwidth the GEMM leaves. Timed, per layer (the median of the reps, CUDA events around
all layers, weights cold: each layer its own, 4 layers > 8x the L2):

- serial: gemm() as the engine calls it today (dequantize, then the float GEMM, one stream)
- overlap: the same two kernels, linear i + 1's pass on the side stream under linear i's GEMM
- overlap_prio: the same with the GEMMs on a high-priority stream (the block scheduler places their CTAs first)
- gemm_only: the float GEMM on pre-dequantized weights (the floor the overlap can reach)
- dequant_only: the passes alone
- cublas / cublas_overlap: torch's bf16 matmul in place of the Triton GEMM (reference)

    python experiments/quant4/overlap/bench_overlap.py OUT.json [--ms 256 512 1024] [--mxfp4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tritonllm.kernels import gemm as g  # noqa: E402
from tritonllm.kernels.gemm_dequant import dequantize  # noqa: E402
from tritonllm.kernels.quant_formats import FP4, INT4, QuantScheme  # noqa: E402
from tritonllm.quantization.quantize import quantize_weight  # noqa: E402

SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--ms", nargs="+", type=int, default=[256, 512, 1024])
    parser.add_argument("--mxfp4", action="store_true")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    scheme = QuantScheme(FP4, "mx", "none") if args.mxfp4 else QuantScheme(INT4, "group", "none", group_size=128)
    sargs = g.scale_args(scheme)
    base = [quantize_weight(torch.randn(n, k, device="cuda").div_(64), scheme) for _, n, k in SHAPES]
    lins = [(name, q if layer == 0 else _clone(q)) for layer in range(args.layers) for (name, _, _), q in
            zip(SHAPES, base)]  # fmt: skip
    rows = []
    for m in args.ms:
        rows.append(measure(m, lins, sargs, args))
        args.out.write_text(json.dumps(rows, indent=1))


def measure(m: int, lins: list, sargs: dict, args) -> dict:
    side = torch.cuda.Stream()
    high = torch.cuda.Stream(priority=-1)  # the GEMMs' stream in overlap_prio: its CTAs placed first
    xs = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k in (4096, 14336)}

    def deq(q):
        return dequantize(q.data, q.scale, q.zeros, q.data.shape[1] * 2, sargs["b_decode"], sargs["group_k"],
                          torch.bfloat16)  # fmt: skip

    def x_for(q):
        return xs[q.data.shape[1] * 2]

    def serial():
        for _, q in lins:
            g.gemm(x_for(q), q.data, b_scale=q.scale, b_zero=q.zeros, sm90="faster", **sargs)

    def overlap(matmul):
        main = torch.cuda.current_stream()
        w_next = deq(lins[0][1])
        for i, (_, q) in enumerate(lins):
            w, ev = w_next, None
            if i + 1 < len(lins):
                side.wait_stream(main)  # w's bytes not reused before this point's work is queued
                with torch.cuda.stream(side):
                    w_next = deq(lins[i + 1][1])
                    w_next.record_stream(main)
                    ev = torch.cuda.Event()
                    ev.record(side)
            matmul(x_for(q), w)
            if ev is not None:
                main.wait_event(ev)

    full = [deq(q) for _, q in lins]

    def gemm_only(matmul):
        for (_, q), w in zip(lins, full):
            matmul(x_for(q), w)

    def dequant_only():
        for _, q in lins:
            deq(q)

    def on(stream, fn):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)

    def triton_mm(x, w):
        return g.gemm(x, w)

    def cublas_mm(x, w):
        return x @ w.T

    variants = {
        "serial": serial,
        "overlap": lambda: overlap(triton_mm),
        "gemm_only": lambda: gemm_only(triton_mm),
        "dequant_only": dequant_only,
        "overlap_prio": lambda: on(high, lambda: overlap(triton_mm)),
        "cublas": lambda: gemm_only(cublas_mm),
        "cublas_overlap": lambda: overlap(cublas_mm),
    }
    # the side stream's pass computes what serial's does
    x, q = xs[4096], lins[2][1]
    ref = g.gemm(x, q.data, b_scale=q.scale, b_zero=q.zeros, sm90="faster", **sargs).float()
    with torch.cuda.stream(side):
        w = deq(q)
        w.record_stream(torch.cuda.current_stream())
    torch.cuda.current_stream().wait_stream(side)
    err = ((g.gemm(x, w).float() - ref).abs().max() / ref.abs().max()).item()
    fmt = "mxfp4" if args.mxfp4 else "int4"
    line = f"M={m} ({fmt}, err {err:.1e}):"
    row = dict(m=m, format=fmt, layers=args.layers, rel_err=err, device=torch.cuda.get_device_name())
    for name, fn in variants.items():
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / args.layers)
        row[f"{name}_us_per_layer"] = statistics.median(times)
        line += f" {name} {row[f'{name}_us_per_layer']:.0f}"
    print(line + " us/layer", flush=True)
    return row


def _clone(q):
    import dataclasses

    return dataclasses.replace(q, **{f.name: (v.clone() if isinstance(v := getattr(q, f.name), torch.Tensor) else v)
                                     for f in dataclasses.fields(q)})  # fmt: skip


if __name__ == "__main__":
    main()
