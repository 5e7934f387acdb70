"""Does a weight prefetched into L2 (kernels/l2_prefetch.py) make the decode GEMV that reads it faster?

Each case is a CUDA graph replayed with L2 flushed before every replay (a 256 MB fill); a torch.profiler
trace gives each kernel's mean time and the replay's window (bench_moe.kernel_us). Cases:

- `gemv:<layer>:<format>`: the layer's linear at M = 1 on a cold weight, then the same after
  `prefetch_l2(weight)` and a spin of `--gap-us` (the latency-bound kernels a decode step runs between
  GEMVs: norms, RoPE, attention), then with the prefetch and no gap (the prefetch racing the GEMV).
- `moe_then_qkv`: gpt-oss-20b's decode tail: its MoE layer at one token (MXFP4 experts, router included) and
  then the next layer's qkv projection (bf16), PDL off and on: without a prefetch; with the qkv weight
  prefetched ahead of the MoE block (session 32's first try: evicted by the experts' stream); prefetched on a
  side stream once w13 is queued (the engine's default, layers/prefetch.py); and that plus the routed experts'
  w2 prefetched during w13 (TRITONLLM_PREFETCH_EXPERTS).

    python experiments/l2_prefetch/bench_prefetch.py OUT.json [--gap-us 10]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_moe import SHAPES, kernel_us, layer_operands, make_experts  # noqa: E402

from tritonllm.kernels import l2_prefetch, registry  # noqa: E402
from tritonllm.kernels.launch import set_pdl  # noqa: E402
from tritonllm.kernels.moe import fused_moe  # noqa: E402
from tritonllm.kernels.moe_route import router_route  # noqa: E402
from tritonllm.kernels.quant_formats import FP4, INT4, QuantScheme  # noqa: E402
from tritonllm.quantization.quantize import quantize_weight  # noqa: E402

LAYERS = {  # (N, K)
    "gptoss_qkv": (5120, 2880),
    "gptoss_o": (2880, 4096),
    "llama_qkv": (6144, 4096),
    "llama_o": (4096, 4096),
    "llama_down": (4096, 14336),
}
SCHEMES = {"int4": QuantScheme(INT4, "group", "none", group_size=128), "mxfp4": QuantScheme(FP4, "mx", "none")}


def spin(us: float) -> None:
    """A kernel that idles about `us` microseconds (torch.cuda._sleep counts clock cycles)."""
    if us > 0:
        torch.cuda._sleep(int(us * 1700))  # cycles: about 1.7 GHz under load (H100 / H200)


def linear_fn(fmt: str, n: int, k: int):
    """(the layer's M = 1 linear as a callable, the tensors that hold its weight)."""
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    x = torch.randn(1, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) * k**-0.5).to(torch.bfloat16)
    if fmt == "bf16":
        return (lambda: F.linear(x, w)), [w]
    weight = quantize_weight(w, SCHEMES[fmt])
    impl = next(i for i in registry.implementations("linear") if i.name == "triton_sm90")
    return (lambda: impl.entries["quantized_linear"](x, weight, None)), [
        t for t in (weight.data, weight.scale, weight.zeros) if t is not None
    ]


def gemv_case(layer: str, fmt: str, gap_us: float) -> dict:
    n, k = LAYERS[layer]
    run, tensors = linear_fn(fmt, n, k)
    out = dict(case=f"gemv:{layer}:{fmt}", n=n, k=k, bytes=sum(t.numel() * t.element_size() for t in tensors))
    out["cold"] = kernel_us(lambda: (spin(gap_us), run()))
    out["prefetched_gap"] = kernel_us(lambda: ([l2_prefetch.prefetch_l2(t) for t in tensors], spin(gap_us), run()))
    out["prefetched_nogap"] = kernel_us(lambda: ([l2_prefetch.prefetch_l2(t) for t in tensors], run()))
    return out


def moe_then_qkv(pdl: bool) -> dict:
    set_pdl(pdl)
    e, top_k, h, _ = SHAPES["gptoss"]
    experts = make_experts("mxfp4", *SHAPES["gptoss"][:1], h, SHAPES["gptoss"][3])
    x, _, _, _, gen = layer_operands("gptoss", 1)
    router = (torch.randn(e, h, device="cuda", generator=gen) * h**-0.5).to(torch.bfloat16)
    bias = torch.randn(e, device="cuda", generator=gen).to(torch.bfloat16)
    n, k = LAYERS["gptoss_qkv"]
    wqkv = (torch.randn(n, k, device="cuda", generator=gen) * k**-0.5).to(torch.bfloat16)

    w2 = experts["w2"]
    side = torch.cuda.Stream()

    def on_side(fn) -> None:  # as layers/prefetch.py forks: after the work queued so far
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()

    def layer(mode: str):
        if mode == "qkv_before":  # on the step's stream, ahead of the MoE block
            l2_prefetch.prefetch_l2(wqkv)
        weights, ids = router_route(x, router, bias, top_k, True)
        if mode == "experts_and_qkv_after_w13":  # TRITONLLM_PREFETCH_EXPERTS: w2's routed experts during w13
            on_side(lambda: [l2_prefetch.prefetch_experts_l2(t, ids) for t in (w2.data, w2.scale)])
        after_w13 = None
        if mode.endswith("qkv_after_w13"):  # the engine's default
            after_w13 = lambda: on_side(lambda: l2_prefetch.prefetch_l2(wqkv))  # noqa: E731
        y = fused_moe(x, experts["w13"], w2, weights, ids, activation="swiglu_oai", after_w13=after_w13)
        torch.cuda.current_stream().wait_stream(side)
        return F.linear(y, wqkv)

    out = dict(case=f"moe_then_qkv:pdl{int(pdl)}")
    for mode in ("plain", "qkv_before", "qkv_after_w13", "experts_and_qkv_after_w13"):
        out[mode] = kernel_us(lambda mode=mode: layer(mode))
    set_pdl(False)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("--gap-us", type=float, default=10.0)
    parser.add_argument("--gemv", nargs="*", default=["gptoss_qkv:bf16", "gptoss_o:bf16", "llama_o:bf16",
                                                      "llama_qkv:int4", "llama_down:int4", "llama_qkv:mxfp4"])  # fmt: skip
    args = parser.parse_args()
    assert l2_prefetch.available(), "needs an NVIDIA GPU of compute capability 9.0+"
    rows = [dict(device=torch.cuda.get_device_name(), gap_us=args.gap_us)]
    for case in args.gemv:
        layer, fmt = case.split(":")
        rows.append(gemv_case(layer, fmt, args.gap_us))
        print(json.dumps(rows[-1]), flush=True)
    for pdl in (False, True):
        rows.append(moe_then_qkv(pdl))
        print(json.dumps(rows[-1]), flush=True)
    Path(args.output).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
