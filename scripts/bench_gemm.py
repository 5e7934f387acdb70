"""GEMM benchmark: every registered linear implementation beside torch's own GEMMs, on the GPU.

    python scripts/bench_gemm.py OUT.json [--models llama3-8b qwen3-0.6b square8192] [--ms 1 16 ...]
        [--formats bf16 fp8 fp8_block int8 mxfp8 w8a16 int4 mxfp4 uint8_g32]

Per layer shape (N, K) of the model and M (tokens), per format: the Triton GEMM on operands
already quantized (kernels/gemm.py) beside torch's GEMM of the same precision (bf16
torch.matmul; FP8 torch._scaled_mm with row/column scales; INT8 torch._int_mm then scales) and
beside bf16 cuBLAS; the registered implementations' whole quantized_linear (activation
quantization included) too. Each output is checked against float32 of the dequantized operands.
Reports median us, TFLOP/s, TB/s (operands + output read/written once) and the ratios. Timing
replays each call from a CUDA graph by default (triton.testing.do_bench_cudagraph: GPU time only,
as the engine's graph-replayed steps pay it); `--timing eager` times ordinary launches
(do_bench), host launch time included, which dominates at small M. Each timed call reads its weight
cold in L2 as a model's step does (scripts/cold_l2.py: calls rotate through copies of the weight);
`--l2 warm` times one copy, L2-resident wherever it fits (how the figures before session 20 were taken).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.cold_l2 import copies, rotate  # noqa: E402
from tritonllm.kernels import gemm as g  # noqa: E402
from tritonllm.kernels import gemm_block_sm90, reference, registry  # noqa: E402
from tritonllm.kernels.quant_formats import FP4, INT4, UINT8, QuantScheme  # noqa: E402
from tritonllm.quantization.quantize import quantize_weight  # noqa: E402

# (layer, N, K) of each model: q/k/v fused, o, gate/up fused, down
MODELS = {
    "llama3-8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)],
    "qwen3-0.6b": [("qkv", 4096, 1024), ("o", 1024, 2048), ("gate_up", 6144, 1024), ("down", 1024, 3072)],
    "square8192": [("square", 8192, 8192)],
}
MS = [1, 4, 16, 64, 256, 1024, 4096, 8192]
PERSISTENT_MIN_M = 256  # the persistent descriptor kernel is timed beside the pointer kernel from here
FP8 = torch.float8_e4m3fn
SCHEMES = {
    "fp8": QuantScheme(FP8, "channel", "token"),
    "fp8_block": QuantScheme(FP8, "block", "group"),
    "int8": QuantScheme(torch.int8, "channel", "token"),
    "mxfp8": QuantScheme(FP8, "mx", "mx"),
    "w8a16": QuantScheme(FP8, "channel", "none"),
    "int4": QuantScheme(INT4, "group", "none", group_size=128),  # W4A16, online quantization="int4"; GPTQ/AWQ g128
    "int4_g32": QuantScheme(INT4, "group", "none", group_size=32),  # GGUF Q4_K / Q4_0 as loaded
    "mxfp4": QuantScheme(FP4, "mx", "none"),  # W4A16 MXFP4 (gpt-oss, online quantization="mxfp4")
    "uint8_g32": QuantScheme(UINT8, "group", "none", group_size=32),  # 8-bit GPTQ g32, GGUF Q8_0 / Q5_K / Q6_K
}


TIMING = {
    "graph": lambda fn: triton.testing.do_bench_cudagraph(fn, rep=20),
    "eager": lambda fn: triton.testing.do_bench(fn, warmup=5, rep=25),
}
bench = TIMING["graph"]
COLD_L2 = [True]


def bench_us(make, weights: list) -> float:
    """Median us of make(w)() over a weight's copies (copies(): one unless L2 is cold), in turn."""
    return bench(rotate(make, weights)) * 1000


def rel_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected).abs().max() / expected.abs().max().clamp(min=1e-6))


def torch_gemm(fmt: str, a, a_scale):
    """A maker of torch's own GEMM of the format on the same quantized operands (None: torch has none)."""
    if fmt not in ("fp8", "int8") or (fmt == "int8" and a.shape[0] <= 16):
        return None
    return lambda weight: _torch_gemm(fmt, a, a_scale, weight)


def _torch_gemm(fmt: str, a, a_scale, weight):
    if fmt == "fp8":
        scale_b = weight.scale.reshape(1, -1)
        return lambda: torch._scaled_mm(a, weight.data.t(), scale_a=a_scale, scale_b=scale_b, out_dtype=torch.bfloat16)
    scale_b = weight.scale.reshape(1, -1)
    return lambda: (torch._int_mm(a, weight.data.t()).float() * a_scale * scale_b).to(torch.bfloat16)


def triton_gemm(a, a_scale, tiles: g.GemmTiles | None = None, sm90: str = "never"):
    """A maker of the Triton GEMM's call on a quantized weight."""
    return lambda weight: _triton_gemm(a, a_scale, weight, tiles, sm90)


def _triton_gemm(a, a_scale, weight, tiles, sm90):
    scales = g.scale_args(weight.scheme)
    return lambda: g.gemm(a, weight.data, None, out_dtype=torch.bfloat16, a_scale=a_scale, b_scale=weight.scale,
                          b_zero=weight.zeros, tiles=tiles, sm90=sm90, **scales)  # fmt: skip


def linear_rows(row: dict, x: torch.Tensor, weights: list, formats: frozenset, expected=None) -> list[dict]:
    """A row (`row` and its timing) per registered linear implementation that serves the weights' formats (none:
    16-bit, the `linear` entry; else `quantized_linear`), torch_ref left out; with `expected`, its error too."""
    context = registry.KernelContext("cuda", torch.bfloat16, None, None, formats)
    entry = "quantized_linear" if formats else "linear"
    rows = []
    for impl in registry.implementations("linear"):
        if impl.name == "torch_ref" or impl.supports.refusal(context) is not None:
            continue
        make = lambda w, impl=impl: lambda: impl.entries[entry](x, w, None)  # noqa: E731
        rows.append(dict(row, impl=f"linear:{impl.name}", us=bench_us(make, weights)))
        if expected is not None:
            rows[-1]["rel_error"] = rel_error(make(weights[0])(), expected)
    return rows


def run_case(model: str, layer: str, n: int, k: int, m: int, formats: list[str]) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.float32).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen, dtype=torch.float32) * 0.02).to(torch.bfloat16)
    flops = 2 * m * n * k
    rows = []
    w_copies = copies(w, COLD_L2[0])  # one set a case, shared by the bf16 timings
    cublas_us = bench_us(lambda w: lambda: torch.matmul(x, w.t()), w_copies)
    base = dict(model=model, layer=layer, n=n, k=k, m=m)
    rows.append(dict(base, format="bf16", impl="torch.matmul", us=cublas_us))
    for fmt in formats:
        if fmt == "bf16":
            expected = x.float() @ w.float().t()
            got = g.gemm(x, w)
            rows.append(dict(base, format="bf16", impl="triton_gemm", us=bench_us(lambda w: lambda: g.gemm(x, w), w_copies),
                             rel_error=rel_error(got, expected), a_bytes=2, w_bytes=2))  # fmt: skip
            if m >= PERSISTENT_MIN_M:
                tiles = replace(g.pick_tiles("float", m), persistent=True)
                make = lambda w, tiles=tiles: lambda: g.gemm(x, w, tiles=tiles)  # noqa: E731
                rows.append(dict(base, format="bf16", impl="triton_persistent", us=bench_us(make, w_copies),
                                 rel_error=rel_error(make(w)(), expected), a_bytes=2, w_bytes=2))  # fmt: skip
            rows += linear_rows(dict(base, format="bf16", a_bytes=2, w_bytes=2), x, w_copies, frozenset(), expected)
            continue
        scheme = SCHEMES[fmt]
        weight = quantize_weight(w, scheme)
        if scheme.act == "none":
            a, a_scale, expected_a = x, None, x.float()
        else:
            a, a_scale = reference.quantize_activation(x, scheme)
            expected_a = reference.dequantize_activation(a, a_scale, scheme)
        expected = expected_a @ reference.dequantize_weight(weight).t()
        weights = copies(weight, COLD_L2[0])  # one set a format, shared by its timings
        a_bytes = 2 if scheme.act == "none" else 1
        make = triton_gemm(a, a_scale)
        w_bytes = 0.5 if scheme.packed else 1
        rows.append(dict(base, format=fmt, impl="triton_gemm", us=bench_us(make, weights),
                         rel_error=rel_error(make(weight)(), expected), a_bytes=a_bytes, w_bytes=w_bytes))  # fmt: skip
        if fmt in ("fp8", "int8") and m >= PERSISTENT_MIN_M:  # the persistent descriptor kernel, same tiles
            tiles = replace(g.pick_tiles("w8a8", m), persistent=True)
            make = triton_gemm(a, a_scale, tiles)
            rows.append(dict(base, format=fmt, impl="triton_persistent", us=bench_us(make, weights),
                             rel_error=rel_error(make(weight)(), expected), a_bytes=a_bytes, w_bytes=1))  # fmt: skip
        if fmt == "fp8_block" and m > 64 and gemm_block_sm90.available():  # the Hopper Gluon kernel (kernel only)
            make = triton_gemm(a, a_scale, sm90="always")
            rows.append(dict(base, format=fmt, impl="triton_block_sm90", us=bench_us(make, weights),
                             rel_error=rel_error(make(weight)(), expected), a_bytes=1, w_bytes=1))  # fmt: skip
        make = torch_gemm(fmt, a, a_scale)
        if make is not None:
            rows.append(dict(base, format=fmt, impl="torch_gemm", us=bench_us(make, weights),
                             rel_error=rel_error(make(weight)(), expected), a_bytes=a_bytes, w_bytes=1))  # fmt: skip
        # the whole layer: activation quantization included
        rows += linear_rows(dict(base, format=fmt, a_bytes=a_bytes, w_bytes=w_bytes), x, weights,
                            frozenset({scheme.format_name}))  # fmt: skip
    for r in rows:
        r["tflops"] = round(flops / r["us"] / 1e6, 2)
        a_b, w_b = r.get("a_bytes", 2), r.get("w_bytes", 2)
        r["tbps"] = round((m * k * a_b + n * k * w_b + m * n * 2) / r["us"] / 1e6, 3)
        r["speedup_vs_bf16_cublas"] = round(cublas_us / r["us"], 3)
        r["us"] = round(r["us"], 2)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--ms", nargs="+", type=int, default=MS)
    parser.add_argument("--formats", nargs="+", default=["bf16", *SCHEMES])
    parser.add_argument(
        "--timing", choices=sorted(TIMING), default="graph", help="graph: GPU time; eager: with launches"
    )
    parser.add_argument(
        "--l2", choices=["cold", "warm"], default="cold", help="weights cold in L2 (as in a model) or not"
    )
    args = parser.parse_args()
    global bench
    bench = TIMING[args.timing]
    COLD_L2[0] = args.l2 == "cold"
    rows = []
    for model in args.models:
        for layer, n, k in MODELS[model]:
            ms = [4096] if model == "square8192" else args.ms
            for m in ms:
                case_rows = run_case(model, layer, n, k, m, args.formats)
                rows += case_rows
                line = "  ".join(
                    f"{r['format']}/{r['impl']} {r['us']:.1f}us x{r['speedup_vs_bf16_cublas']:.2f}" for r in case_rows
                )
                print(f"{model} {layer} N={n} K={k} M={m}: {line}", flush=True)
                args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                "triton": triton.__version__, "timing": args.timing, "l2": args.l2, "rows": rows}, indent=1))  # fmt: skip
    bad = [r for r in rows if r.get("rel_error", 0) > 2e-2]
    print(f"{len(rows)} timings; outputs off by more than 2% of their scale: {len(bad)}")
    for r in bad:
        print("  ", r)


if __name__ == "__main__":
    main()
