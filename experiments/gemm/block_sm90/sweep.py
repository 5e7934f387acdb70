"""Block-FP8 GEMM on Hopper: the Gluon kernel (kernels/gemm_block_sm90.py) at each stage count beside
the portable block-FP8 kernels and bf16 cuBLAS, graph-replayed, outputs checked against float32 of
the dequantized operands.

    python experiments/gemm/block_sm90/sweep.py OUT.json [--ms 256 1024 4096 8192] [--stages 3 4 5 6]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tritonllm.kernels import gemm as g  # noqa: E402
from tritonllm.kernels import gemm_block_sm90 as blk  # noqa: E402
from tritonllm.kernels import reference  # noqa: E402
from tritonllm.kernels.quant_formats import QuantScheme  # noqa: E402
from tritonllm.quantization.quantize import quantize_weight  # noqa: E402

SCHEME = QuantScheme(torch.float8_e4m3fn, "block", "group")
SHAPES = {"square": (8192, 8192), "qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}  # fmt: skip


def us(fn) -> float:
    fn()
    return triton.testing.do_bench_cudagraph(fn, rep=50) * 1000


def case(name: str, m: int, stage_counts: list[int]) -> dict:
    """One shape at one M: bf16 cuBLAS, the portable block-FP8 kernels, the Gluon kernel per stage count."""
    n, k = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    weight = quantize_weight(w, SCHEME)
    a, a_scale = reference.quantize_activation(x, SCHEME)
    expected = reference.dequantize_activation(a, a_scale, SCHEME) @ reference.dequantize_weight(weight).t()

    def run(sm90: str):
        return g.gemm(a, weight.data, None, out_dtype=torch.bfloat16, a_scale=a_scale, b_scale=weight.scale,
                      sm90=sm90, **g.scale_args(SCHEME))  # fmt: skip

    cublas = us(lambda: torch.matmul(x, w.t()))
    row = dict(
        shape=name, n=n, k=k, m=m, bf16_cublas_us=round(cublas, 2), portable_us=round(us(lambda: run("never")), 2)
    )
    for stages in stage_counts:
        blk.STAGES = stages
        row[f"sm90_s{stages}_err"] = round(
            float((run("always").float() - expected).abs().max() / expected.abs().max()), 5
        )
        row[f"sm90_s{stages}_us"] = round(us(lambda: run("always")), 2)
    best = min(v for key, v in row.items() if key.startswith("sm90_s") and key.endswith("_us"))
    row["best_tflops"] = round(2 * m * n * k / best / 1e6, 1)
    row["best_x_bf16"] = round(cublas / best, 3)
    row["portable_x_bf16"] = round(cublas / row["portable_us"], 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--ms", nargs="+", type=int, default=[256, 1024, 4096, 8192])
    parser.add_argument("--stages", nargs="+", type=int, default=[3, 4, 5, 6])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    args = parser.parse_args()
    rows = []
    for name in args.shapes:
        for m in args.ms:
            row = case(name, m, args.stages)
            print(json.dumps(row), flush=True)
            rows.append(row)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
