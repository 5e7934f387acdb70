"""The Hopper skinny TMA GEMM (kernels/gemm_skinny_sm90.py) at M = 1..64 on Llama-3-8B layer shapes,
bf16 and FP8 W8A8 (per-channel weight, per-token activation scales; the activations quantized before
the timing, as the fused RMSNorm / SiLU-mul quantization leaves them), per plan (rows a program, K
splits, stages, warps), beside bf16 torch.matmul (cuBLAS), torch._scaled_mm (FP8, where it takes the
shape) and the portable Triton kernels that gemm() runs without it, all in the same run
(CUDA-graph replay, triton.testing.do_bench_cudagraph); every output checked against the float32
product of its operands. Each timed call reads its weight cold in L2, as a model's step does
(scripts/cold_l2.py; --warm-l2: one weight copy, how sessions 14-19 timed); --pdl launches the Triton
kernels with programmatic dependent launch as the engine does. On the GPU:

    python experiments/gemm/skinny_sm90/sweep.py OUT.json [--ms 1 4 16 64] [--dtypes bf16 fp8] [--plans auto 128:4:6 ...]
        [--shapes o down] [--pdl]
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
from tritonllm.kernels import gemm_skinny_sm90 as sk  # noqa: E402
from tritonllm.kernels.launch import set_pdl  # noqa: E402
from tritonllm.kernels.quant import quantize_per_token  # noqa: E402
from tritonllm.kernels.quant_formats import QuantScheme  # noqa: E402
from tritonllm.quantization.quantize import quantize_weight  # noqa: E402

# Llama-3-8B's layers, then gpt-oss-20b's bf16 attention projections
SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
          ("gptoss_qkv", 5120, 2880), ("gptoss_o", 2880, 4096)]  # fmt: skip
FP8 = QuantScheme(torch.float8_e4m3fn, "channel", "token")
bench = triton.testing.do_bench_cudagraph


def operands(dtype: str, w: torch.Tensor, x: torch.Tensor):
    """(call(weight, mode): gemm() with sm90=mode on a copy of the weight, the weight as call takes it,
    the float32 reference, torch's own kernel on a weight or None)."""
    if dtype == "bf16":
        return (lambda wt, mode: g.gemm(x, wt, sm90=mode)), w, x.float() @ w.float().T, None
    q_w = quantize_weight(w.float(), FP8)
    q_x, s_x = quantize_per_token(x, torch.float8_e4m3fn)
    args = dict(out_dtype=torch.bfloat16, a_scale=s_x, **g.scale_args(FP8))
    expected = (q_x.float() * s_x) @ (q_w.data.float() * q_w.scale[:, None]).T

    def scaled_mm(q):
        return torch._scaled_mm(q_x, q.data.T, scale_a=s_x, scale_b=q.scale.reshape(1, -1), out_dtype=torch.bfloat16)

    try:
        scaled_mm(q_w)
    except RuntimeError:  # row-wise scales need M, N, K multiples of 16 (cuBLAS / CUTLASS)
        scaled_mm = None
    return (lambda q, mode: g.gemm(q_x, q.data, sm90=mode, b_scale=q.scale, **args)), q_w, expected, scaled_mm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--ms", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp8"], choices=["bf16", "fp8"])
    parser.add_argument("--plans", nargs="+", default=["auto", "128:1:6", "128:2:6", "128:4:6", "64:2:8", "128:2:4:8"],
                        help="BLOCK_N:SPLIT[:STAGES[:WARPS]] (auto: gemm_skinny_sm90.plan)")  # fmt: skip
    parser.add_argument("--warm-l2", action="store_true", help="time one weight copy (L2-warm where it fits)")
    parser.add_argument("--pdl", action="store_true",
                        help="launch the Triton kernels with programmatic dependent launch, as the engine does: each "
                             "call's first weight copies start under the previous call's tail (cuBLAS unchanged)")  # fmt: skip
    parser.add_argument("--shapes", nargs="+", default=[s[0] for s in SHAPES], choices=[s[0] for s in SHAPES])
    args = parser.parse_args()
    set_pdl(args.pdl)
    cold = not args.warm_l2
    rows = []
    for layer, n, k in (s for s in SHAPES if s[0] in args.shapes):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        for m in args.ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            bf16 = bench(rotate(lambda wb, x=x: lambda: x @ wb.T, copies(w, cold)))
            for dtype in args.dtypes:
                call, weight, expected, torch_own = operands(dtype, w, x)
                weights = copies(weight, cold)
                weight_bytes = n * k * (2 if dtype == "bf16" else 1)
                portable = bench(rotate(lambda q, call=call: lambda: call(q, "never"), weights))
                own = bench(rotate(lambda q, own=torch_own: lambda: own(q), weights)) if torch_own is not None else None
                line = f"{layer} {n}x{k} M={m} {dtype}: bf16 {bf16 * 1e3:.1f}us portable {bf16 / portable:.2f}x"
                line += f" _scaled_mm {bf16 / own:.2f}x" if own else ""
                for spec in args.plans:
                    sk.PLAN_OVERRIDE = None if spec == "auto" else sk.Plan.parse(spec)
                    got = call(weight, "always")
                    err = ((got.float() - expected).abs().max() / expected.abs().max()).item()
                    us = bench(rotate(lambda q, call=call: lambda: call(q, "always"), weights))
                    rows.append(dict(layer=layer, n=n, k=k, m=m, dtype=dtype, plan=spec, l2="warm" if args.warm_l2 else "cold", pdl=args.pdl,
                                     resolved=dataclasses.asdict(sk.plan(m, n, k, 2 if dtype == "bf16" else 1)),
                                     us=us * 1e3, bf16_us=bf16 * 1e3, portable_us=portable * 1e3,
                                     torch_own_us=own * 1e3 if own else None, speedup_vs_bf16=bf16 / us,
                                     speedup_vs_portable=portable / us, tb_s=weight_bytes / us / 1e9,
                                     rel_err=err))  # fmt: skip
                    line += (
                        f" | {spec} {us * 1e3:.1f}us {bf16 / us:.2f}x {weight_bytes / us / 1e9:.2f}TB/s err {err:.0e}"
                    )
                sk.PLAN_OVERRIDE = None
                print(line, flush=True)
                args.out.write_text(json.dumps(rows, indent=1))  # as it goes: a run cut short keeps what it measured


if __name__ == "__main__":
    main()
