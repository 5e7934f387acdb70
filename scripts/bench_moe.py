"""Time the Triton fused MoE (kernels/moe.py) beside torch baselines, on the GPU.

    python scripts/bench_moe.py OUT.json [--shapes qwen3 mixtral] [--kinds bfloat16 fp8_block mxfp4]
        [--tokens 1 4 16 64 256 1024 4096 8192] [--torch-ref-max-tokens 256] [--variants] [--kernels]
    python scripts/bench_moe.py OUT.json --router-only [--shapes gptoss qwen3] [--tokens 1 2 3 4]

Shapes: Qwen3-30B-A3B (E 128, top-8, H 2048, I 768) and Mixtral-8x7B (E 8, top-2, H 4096, I 14336),
random bf16 weights (FP8 block-128 and MXFP4 experts quantized from them), random router logits
routed by the Triton router (softmax, renormalised). Per case:

- triton_ms: fused_moe (alignment, activation quantization, both GEMMs, the slot sum), the median
  of warm runs (triton.testing.do_bench, L2 flushed between runs); triton_cold_ms: its first call
  for that case, timed to completion (includes Triton's compilation where the case needs a new
  specialisation); triton_graph_ms (tokens <= 256: decode sizes): replayed from a CUDA graph;
  route_ms: the router alone; router_unfused_us / router_fused_us (tokens <= 8 on the GPU, graph replay):
  the router's linear layer [E, H] with a bias (cuBLAS) and then the routing kernel, against the two in one
  kernel (moe_route.router_route: fuse_moe_router); --router-only: those two figures alone (no experts built);
- loop_ms: a per-expert torch loop in bf16 (one sort, x[rows] @ w13[e].T, SiLU-mul, @ w2[e].T,
  index_add per expert hit; quantized kinds use the dequantized bf16 weights: the baseline a
  quantized checkpoint would otherwise run); torch_ref_ms (tokens <= --torch-ref-max-tokens): the
  registered torch reference (float32 math), the ablation baseline; rel_error_vs_loop: the largest
  difference from the loop relative to its largest output (FP8 experts: includes the activations'
  1 x 128 quantization, which the loop does not do: a few 1e-2 is expected there);
- tflops: useful work 2 T k (H 2I + I H) over triton_ms; weight_gbps: the expert weights actually
  touched (distinct experts hit x bytes per expert, scales included) over triton_ms;
- variants (--variants): the layer with each variant of its picked tiles off and on, the tiles
  otherwise those picked: the GEMV's (kernels/moe_gemv.py: "none", "joint", "sum_slots", "both"), the
  grouped GEMM's ("none", "tma_w13", "tma_w2": B through tensor descriptors, "sorted_w2": w2 on the
  intermediate in the alignment's order, A through a descriptor, "tma": all three); warm ms, graph
  ms (decode sizes), weight GB/s and TFLOP/s by graph (else warm) time, the error against the loop;
- kernel_us (--kernels, decode sizes on the GPU): each kernel's mean time in a graph replay (L2
  flushed between replays) and the replay's window, from a torch.profiler trace.
- layers_us / layers_router_us (--layers L > 1, decode sizes): the layer as a model's step pays it, one CUDA
  graph of L consecutive layers, each with its own experts (seeds 1..L-1 beside the case's), the output of
  one the input of the next, the graph's replay over L (L2 flushed before each replay): fused_moe alone on
  the case's routing (layers_us, with layers_weight_gbps over the experts it touches), and each layer's own
  router first (router_route on its input, or the router's GEMM and moe_route past ROUTER_MAX_TOKENS: a
  random [E, H] router with a bias; layers_router_us, with layers_router_weight_gbps over the experts the
  routers pick). A one-layer graph's replay also carries the
  graph's own launch and the hand-offs before and after it, which a step of many layers pays once.

--pdl: the kernels launch with programmatic dependent launch, as the engine's decode steps do (off by
default: the figures before session 30 were taken without it).

Writes every row to OUT.json (device, torch and Triton versions) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tritonllm import platform  # noqa: E402
from tritonllm.kernels import moe_tiles, reference  # noqa: E402
from tritonllm.kernels.moe import fused_moe, moe_tiles_for  # noqa: E402
from tritonllm.kernels.moe_route import ROUTER_MAX_TOKENS, moe_route, router_route  # noqa: E402
from tritonllm.kernels.quant_formats import FP4, QuantizedWeight, QuantScheme  # noqa: E402
from tritonllm.layers.moe import aligned_rows  # noqa: E402
from tritonllm.quantization.quantize import quantize_experts  # noqa: E402

# name -> (experts, top_k, hidden, intermediate)
SHAPES = {
    "qwen3": (128, 8, 2048, 768),
    "mixtral": (8, 2, 4096, 14336),
    "gptoss": (32, 4, 2880, 2880),
    "tiny": (6, 2, 64, 96),
}
DEFAULT_SHAPES = ["qwen3", "mixtral"]  # "tiny": a dry run of the scripts on the CPU (interpreter, float32)
DEVICE = platform.DEVICE
DTYPE = torch.bfloat16 if platform.is_gpu() else torch.float32
TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 8192]
SCHEMES = {
    "bfloat16": None,
    "fp8_block": QuantScheme(torch.float8_e4m3fn, "block", "group"),
    "mxfp4": QuantScheme(FP4, "mx", "none"),
}


def make_experts(kind: str, e: int, h: int, i: int, seed: int = 0) -> dict:
    """w13 / w2 of `kind` (bf16 tensors or QuantizedWeight) and their bf16 (dequantized) versions."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    w13 = (torch.randn(e, 2 * i, h, device=DEVICE, generator=gen) * h**-0.5).to(DTYPE)
    w2 = (torch.randn(e, h, i, device=DEVICE, generator=gen) * i**-0.5).to(DTYPE)
    scheme = SCHEMES[kind]
    if scheme is None:
        return dict(w13=w13, w2=w2, w13_bf16=w13, w2_bf16=w2)
    q13, q2 = quantize_experts(w13, scheme), quantize_experts(w2, scheme)
    if not scheme.is_fp8:  # MXFP4 rows aligned as the engine keeps them (layers/moe.py aligned_rows)
        q13, q2 = (replace(q, data=aligned_rows(q.data)) for q in (q13, q2))
    return dict(w13=q13, w2=q2, w13_bf16=_dequantized(q13), w2_bf16=_dequantized(q2))


def _dequantized(w: QuantizedWeight) -> torch.Tensor:
    return torch.stack([reference.dequantize_weight(reference.expert_weight(w, e)) for e in range(w.data.shape[0])]).to(
        DTYPE
    )


def bytes_per_expert(w: torch.Tensor | QuantizedWeight) -> int:
    if isinstance(w, QuantizedWeight):
        return (w.data.numel() * w.data.element_size() + w.scale.numel() * w.scale.element_size()) // w.data.shape[0]
    return w[0].numel() * w.element_size()


def torch_loop(x, w13, w2, topk_weights, topk_ids) -> torch.Tensor:
    """The per-expert bf16 baseline: rows sorted by expert, two matmuls and an index_add per expert hit."""
    top_k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()  # a host sync, as eager MoE loops do
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    weights = topk_weights.reshape(-1)
    start = 0
    for e, count in enumerate(counts):
        if count == 0:
            continue
        pairs = order[start : start + count]
        start += count
        tokens = pairs // top_k
        gate, up = F.linear(x[tokens], w13[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[e])
        out.index_add_(0, tokens, y.float() * weights[pairs, None])
    return out.to(x.dtype)


def _sync() -> None:
    if platform.is_gpu():
        torch.cuda.synchronize()


def median_ms(fn, rep: int = 50) -> float:
    if not platform.is_gpu():  # dry run: a few calls
        return sorted(cold_ms(fn) for _ in range(3))[1]
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=rep, return_mode="median")


def cold_ms(fn) -> float:
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    return (time.perf_counter() - start) * 1e3


def captured(fn) -> torch.cuda.CUDAGraph:
    fn()  # compiled before capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_ms(fn) -> float:
    return median_ms(captured(fn).replay)


def kernel_us(fn, reps: int = 20) -> dict:
    """Each kernel's mean GPU time (us) a call of fn, from a torch.profiler trace of `reps` CUDA-graph
    replays with L2 flushed between them (a 256 MB fill, left out); "window": the median replay's span,
    its first kernel's start to its last kernel's end (launch gaps and PDL overlap included)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    graph = captured(fn)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            graph.replay()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        prof.export_chrome_trace(trace.name)
        events = json.load(open(trace.name))["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    out: dict = {}
    windows, span = [], None
    for e in kernels:
        if "fill" in e["name"].lower():  # the flush: closes the replay before it
            if span:
                windows.append(span[1] - span[0])
            span = None
            continue
        key = e["name"].split("(")[0][:60]
        out[key] = out.get(key, 0.0) + e["dur"] / reps
        end = e["ts"] + e["dur"]
        span = (e["ts"], end) if span is None else (span[0], max(span[1], end))
    if span:
        windows.append(span[1] - span[0])
    out["window"] = sorted(windows)[len(windows) // 2] if windows else 0.0
    return {k: round(v, 2) for k, v in out.items()}


def device_name() -> str:
    return torch.cuda.get_device_name() if platform.is_gpu() else "cpu (interpreter)"


# the layer's variants (MoeTiles' flags) A/B-timed by --variants: the GEMV's, or the grouped GEMM's
VARIANTS = {
    "gemv": {"none": {}, "joint": dict(joint=True), "sum_slots": dict(sum_slots=True),
             "both": dict(joint=True, sum_slots=True)},
    "grouped": {"none": {}, "tma_w13": dict(tma_w13=True), "tma_w2": dict(tma_w2=True),
                "sorted_w2": dict(sorted_w2=True), "tma": dict(tma_w13=True, tma_w2=True, sorted_w2=True)},
}  # fmt: skip
NO_VARIANTS = dict.fromkeys(moe_tiles.VARIANTS, False)


def layer_variants(x, w13, w2, weights, ids, expected: torch.Tensor, flops: float, weight_bytes: int) -> dict:
    """The layer under each variant of the picked tiles' kind (bench_case's operands), the tiles
    otherwise those picked."""
    picked = moe_tiles_for(x, w13, w2, ids.shape[1])
    out = {}
    for name, flags in VARIANTS["gemv" if picked.gemv else "grouped"].items():
        tiles = replace(picked, **{**NO_VARIANTS, **flags})
        run = lambda: fused_moe(x, w13, w2, weights, ids, tiles=tiles)  # noqa: E731, B023
        err = float((run().float() - expected).abs().max() / expected.abs().max())
        row = dict(ms=median_ms(run), rel_error_vs_loop=err)
        if platform.is_gpu() and x.shape[0] <= 256:
            row["graph_ms"] = graph_ms(run)
        seconds = row.get("graph_ms", row["ms"]) * 1e-3
        row["weight_gbps"] = weight_bytes / seconds / 1e9
        row["tflops"] = flops / seconds / 1e12
        out[name] = row
    return out


def layer_operands(name: str, tokens: int) -> tuple:
    """A case's random activations x [T, H] and router logits [T, E] (seeded by the token count), their
    routing (softmax, renormalised: weights, ids), and the generator for any further draws."""
    e, top_k, h, _ = SHAPES[name]
    gen = torch.Generator(device=DEVICE).manual_seed(tokens)
    x = torch.randn(tokens, h, device=DEVICE, generator=gen).to(DTYPE)
    logits = torch.randn(tokens, e, device=DEVICE, generator=gen).to(DTYPE)
    weights, ids = moe_route(logits, top_k, True)
    return x, logits, weights, ids, gen


def bench_case(name: str, kind: str, experts: dict, tokens: int, torch_ref_max: int, variants: bool = False,
               kernels: bool = False, stack: list[dict] | None = None) -> dict:  # fmt: skip
    e, top_k, h, i = SHAPES[name]
    x, logits, weights, ids, gen = layer_operands(name, tokens)
    w13, w2 = experts["w13"], experts["w2"]
    run = lambda: fused_moe(x, w13, w2, weights, ids)  # noqa: E731
    row = dict(shape=name, kind=kind, tokens=tokens, experts=e, top_k=top_k, hidden=h, intermediate=i)
    row["triton_cold_ms"] = cold_ms(run)
    row["triton_ms"] = median_ms(run)
    row["route_ms"] = median_ms(lambda: moe_route(logits, top_k, True))
    if tokens <= ROUTER_MAX_TOKENS and platform.is_gpu():
        row.update(router_us(x, e, top_k, gen))
    if tokens <= 256 and platform.is_gpu():
        row["triton_graph_ms"] = graph_ms(run)
        if kernels:
            try:
                row["kernel_us"] = kernel_us(run)
            except Exception as error:  # noqa: BLE001 - a profiler failure loses this figure, not the run
                row["kernel_us"] = {"error": repr(error)[:200]}
    bf16 = (x, experts["w13_bf16"], experts["w2_bf16"], weights, ids)
    row["loop_ms"] = median_ms(lambda: torch_loop(*bf16))
    expected = torch_loop(*bf16).float()
    row["rel_error_vs_loop"] = float((run().float() - expected).abs().max() / expected.abs().max())
    if tokens <= torch_ref_max:
        row["torch_ref_ms"] = median_ms(lambda: reference.fused_moe(x, w13, w2, weights, ids))
    hit = int(torch.unique(ids).numel())
    row["experts_hit"] = hit
    row["tflops"] = 2 * tokens * top_k * (h * 2 * i + i * h) / (row["triton_ms"] * 1e-3) / 1e12
    row["weight_gbps"] = hit * (bytes_per_expert(w13) + bytes_per_expert(w2)) / (row["triton_ms"] * 1e-3) / 1e9
    row["speedup_vs_loop"] = row["loop_ms"] / row["triton_ms"]
    if stack and tokens <= 256:
        row.update(layers_us(x, weights, ids, stack, hit, bytes_per_expert(w13) + bytes_per_expert(w2)))
    if variants:
        flops, weight_bytes = (
            2 * tokens * top_k * (h * 2 * i + i * h),
            hit * (bytes_per_expert(w13) + bytes_per_expert(w2)),
        )
        row["variants"] = layer_variants(x, w13, w2, weights, ids, expected, flops, weight_bytes)
    return row


def stacked_layers(name: str, kind: str, experts: dict, layers: int) -> list[dict]:
    """`layers` expert sets for --layers: the case's, then seeds 1.. (bf16 / quantized as `kind`), each with a
    random router [E, H] and bias."""
    e, _, h, i = SHAPES[name]
    sets = [experts] + [make_experts(kind, e, h, i, seed=seed) for seed in range(1, layers)]
    out = []
    for seed, s in enumerate(sets):
        gen = torch.Generator(device=DEVICE).manual_seed(1000 + seed)
        router = (torch.randn(e, h, device=DEVICE, generator=gen) * h**-0.5).to(DTYPE)
        bias = torch.randn(e, device=DEVICE, generator=gen).to(DTYPE)
        out.append(dict(w13=s["w13"], w2=s["w2"], router=router, bias=bias))
    return out


def layers_us(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, stack: list[dict], hit: int,
              per_expert: int) -> dict:  # fmt: skip
    """--layers: a layer's time in a graph of len(stack) chained layers (module docstring), us, and the GB/s of the
    experts touched (`hit` of them on the case's routing, per_expert bytes each); on the CPU (a dry run) the eager
    chain's time."""
    top_k = ids.shape[1]

    def fixed() -> torch.Tensor:
        y = x
        for layer in stack:
            y = fused_moe(y, layer["w13"], layer["w2"], weights, ids)
        return y

    def routed(picked: list | None = None) -> torch.Tensor:
        y = x
        for layer in stack:
            if y.shape[0] <= ROUTER_MAX_TOKENS:  # as layers/moe.py routes: fused at decode sizes
                w, i = router_route(y, layer["router"], layer["bias"], top_k, True)
            else:
                w, i = moe_route(F.linear(y, layer["router"], layer["bias"]), top_k, True)
            if picked is not None:
                picked.append(int(torch.unique(i).numel()))
            y = fused_moe(y, layer["w13"], layer["w2"], w, i)
        return y

    picked: list[int] = []
    routed(picked)  # the experts each layer's router picks (the same in every replay: the inputs are fixed)
    timed = graph_ms if platform.is_gpu() else median_ms
    n = len(stack)
    fixed_us, routed_us = timed(fixed) * 1e3 / n, timed(routed) * 1e3 / n
    return dict(layers=n, layers_us=fixed_us, layers_weight_gbps=hit * per_expert / (fixed_us * 1e-6) / 1e9,
                layers_router_us=routed_us,
                layers_router_weight_gbps=sum(picked) / n * per_expert / (routed_us * 1e-6) / 1e9)  # fmt: skip


def router_us(x: torch.Tensor, e: int, top_k: int, gen: torch.Generator) -> dict:
    """The router for activations x [T, H] and a random [E, H] router with a bias, by graph replay (us): its linear
    layer (cuBLAS) and then the routing kernel, against both in one kernel (router_route)."""
    h = x.shape[1]
    router = (torch.randn(e, h, device=DEVICE, generator=gen) * h**-0.5).to(DTYPE)
    bias = torch.randn(e, device=DEVICE, generator=gen).to(DTYPE)
    unfused = graph_ms(lambda: moe_route(torch.nn.functional.linear(x, router, bias), top_k, True))
    fused = graph_ms(lambda: router_route(x, router, bias, top_k, True))
    return dict(router_unfused_us=unfused * 1e3, router_fused_us=fused * 1e3)


def router_only(shapes: list[str], tokens: list[int]) -> list[dict]:
    """--router-only: router_us at each shape's router and token count (at most ROUTER_MAX_TOKENS), printed."""
    rows = []
    for name in shapes:
        e, top_k, h, _ = SHAPES[name]
        for t in (t for t in tokens if t <= ROUTER_MAX_TOKENS):
            gen = torch.Generator(device=DEVICE).manual_seed(t)
            x = torch.randn(t, h, device=DEVICE, generator=gen).to(DTYPE)
            row = dict(shape=name, tokens=t, experts=e, top_k=top_k, hidden=h, **router_us(x, e, top_k, gen))
            print(f"router {name} E={e} T={t}: GEMM + route {row['router_unfused_us']:.1f} us, fused "
                  f"{row['router_fused_us']:.1f} us", flush=True)  # fmt: skip
            rows.append(row)
    return rows


def add_problem_args(parser: argparse.ArgumentParser) -> None:
    """--shapes, --kinds and --tokens: the problems this script and tune_moe.py run."""
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, choices=list(SHAPES))
    parser.add_argument("--kinds", nargs="+", default=list(SCHEMES), choices=list(SCHEMES))
    parser.add_argument("--tokens", nargs="+", type=int, default=TOKENS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    add_problem_args(parser)
    parser.add_argument("--torch-ref-max-tokens", type=int, default=256, help="time the float32 reference up to here")
    parser.add_argument("--variants", action="store_true", help="time the picked tiles' variants (MoeTiles' flags)")
    parser.add_argument("--kernels", action="store_true", help="decode sizes: each kernel's time in a graph replay")
    parser.add_argument("--router-only", action="store_true", help="the router alone, unfused and fused (the GPU)")
    parser.add_argument("--pdl", action="store_true", help="launch with programmatic dependent launch, as the engine")
    parser.add_argument("--layers", type=int, default=1, help="decode sizes: also a layer in a graph of this many")
    args = parser.parse_args()
    if args.pdl:
        from tritonllm.kernels.launch import set_pdl

        print("PDL", "on" if set_pdl(True) else "unsupported here: off", flush=True)
    import triton

    def write(rows: list[dict]) -> None:
        args.out.write_text(json.dumps(dict(device=device_name(), torch=torch.__version__, triton=triton.__version__,
                                            rows=rows), indent=1))  # fmt: skip

    if args.router_only:
        if not platform.is_gpu():
            parser.error("--router-only times CUDA-graph replays: it needs a GPU")
        write(router_only(args.shapes, args.tokens))
        return
    rows = []
    for name in args.shapes:
        e, _, h, i = SHAPES[name]
        for kind in args.kinds:
            experts = make_experts(kind, e, h, i)
            stack = stacked_layers(name, kind, experts, args.layers) if args.layers > 1 else None
            for tokens in args.tokens:
                row = bench_case(name, kind, experts, tokens, args.torch_ref_max_tokens, args.variants, args.kernels,
                                 stack)  # fmt: skip
                rows.append(row)
                graph = f" graph {row['triton_graph_ms']:.3f}" if "triton_graph_ms" in row else ""
                print(f"{name:8s} {kind:9s} T={tokens:5d}: triton {row['triton_ms']:.3f} ms{graph} (cold "
                      f"{row['triton_cold_ms']:.1f}) loop {row['loop_ms']:.3f} ms x{row['speedup_vs_loop']:.2f}  "
                      f"{row['tflops']:.0f} TFLOP/s  {row['weight_gbps']:.0f} GB/s ({row['experts_hit']} experts)  "
                      f"route {row['route_ms'] * 1e3:.1f} us  err {row['rel_error_vs_loop']:.1e}", flush=True)  # fmt: skip
                if "router_fused_us" in row:
                    unfused, fused = row["router_unfused_us"], row["router_fused_us"]
                    print(f"    router: GEMM + route {unfused:.1f} us, fused {fused:.1f} us", flush=True)
                if "layers_us" in row:
                    print(f"    a layer of {row['layers']}: {row['layers_us']:.1f} us ({row['layers_weight_gbps']:.0f} "
                          f"GB/s); with its router {row['layers_router_us']:.1f} us "
                          f"({row['layers_router_weight_gbps']:.0f} GB/s)", flush=True)  # fmt: skip
                if "kernel_us" in row:
                    print("    kernels (us):", "  ".join(f"{k} {v}" for k, v in row["kernel_us"].items()), flush=True)
                for variant, v in row.get("variants", {}).items():
                    print(f"    {variant:9s}: {v.get('graph_ms', v['ms']) * 1e3:8.1f} us  {v['weight_gbps']:5.0f} GB/s  "
                          f"{v['tflops']:5.0f} TFLOP/s  err {v['rel_error_vs_loop']:.1e}", flush=True)  # fmt: skip
                write(rows)
            del experts, stack
            if platform.is_gpu():
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
