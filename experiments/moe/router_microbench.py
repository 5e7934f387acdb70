"""The MoE router alone on the GPU: the router's linear layer (cuBLAS, with a bias) and then the routing kernel,
against both in one kernel (kernels/moe_route.py's router_route: fuse_moe_router), by CUDA-graph replay, bf16,
at gpt-oss-20b's (32 experts, top-4, hidden 2880) and Qwen3-30B-A3B's (128, top-8, 2048) routers.

    python experiments/moe/router_microbench.py [--tokens 1 2 3 4]
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

from tritonllm.kernels.moe_route import moe_route, router_route

ROUTERS = {"gptoss": (32, 4, 2880), "qwen3": (128, 8, 2048)}  # experts, top_k, hidden


def graph_us(fn) -> float:
    """Median replay time of fn captured in a CUDA graph (compiled and warmed up first)."""
    fn()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return do_bench(graph.replay, warmup=10, rep=100, return_mode="median") * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 3, 4])
    args = parser.parse_args()
    for name, (e, top_k, h) in ROUTERS.items():
        w = (torch.randn(e, h, device="cuda") * h**-0.5).bfloat16()
        b = torch.randn(e, device="cuda").bfloat16()
        for t in args.tokens:
            x = torch.randn(t, h, device="cuda").bfloat16()
            unfused = graph_us(lambda x=x, w=w, b=b, k=top_k: moe_route(torch.nn.functional.linear(x, w, b), k, True))
            fused = graph_us(lambda x=x, w=w, b=b, k=top_k: router_route(x, w, b, k, True))
            print(f"router {name} E={e} T={t}: GEMM + route {unfused:.1f} us, fused {fused:.1f} us", flush=True)


if __name__ == "__main__":
    main()
