"""Time the MoE alignment (kernels/moe_align.py) on the GPU, inside CUDA graphs.

    python scripts/bench_moe_align.py OUT.json [--tokens 1 4 16 64 256 1024 4096 8192]
        [--pairs-per-program 128 256 512] [--layer]

Qwen3-30B-A3B's routing (E 128, top-8) by the Triton router on random logits, at BLOCK_M 16 and 64.
Times are one call's device time: a graph of 20 calls replayed (median of triton.testing.do_bench),
divided by 20, so the graph's own launch is amortised as in a model's step. Per case: torch_us,
the torch ops the kernels replaced (reference.moe_align); triton_us, moe_align at its default
split; split_us, moe_align at each --pairs-per-program (one program when it covers all pairs:
the sweep behind MAX_SINGLE_PAIRS and the range size). With --layer, per token count: fused_moe
of the Qwen3 layer (bf16 experts) with the Triton alignment (layer_us) and with the torch one
(layer_torch_align_us), 5 calls a graph.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_moe import DEVICE, DTYPE, SHAPES, device_name, graph_ms, make_experts  # noqa: E402

from tritonllm.kernels import moe, reference  # noqa: E402
from tritonllm.kernels.moe_align import moe_align  # noqa: E402
from tritonllm.kernels.moe_route import moe_route  # noqa: E402


def in_graph_us(fn, calls: int) -> float:
    """One call's device time: a CUDA graph of `calls` calls replayed, divided by `calls`."""

    def many() -> None:
        for _ in range(calls):
            fn()

    return 1e3 * graph_ms(many) / calls


def align_row(ids: torch.Tensor, e: int, block_m: int, splits: list[int]) -> dict:
    tokens, top_k = ids.shape
    row = dict(tokens=tokens, experts=e, top_k=top_k, block_m=block_m)
    row["torch_us"] = in_graph_us(partial(reference.moe_align, ids, e, block_m), 20)
    row["triton_us"] = in_graph_us(partial(moe_align, ids, e, block_m), 20)
    row["split_us"] = {n: in_graph_us(partial(moe_align, ids, e, block_m, pairs_per_program=n), 20) for n in splits}
    return row


def layer_row(x: torch.Tensor, experts: dict, weights: torch.Tensor, ids: torch.Tensor) -> dict:
    layer = partial(moe.fused_moe, x, experts["w13"], experts["w2"], weights, ids)
    row = dict(tokens=x.shape[0], layer_us=in_graph_us(layer, 5))
    with mock.patch.object(moe, "moe_align", reference.moe_align):
        row["layer_torch_align_us"] = in_graph_us(layer, 5)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 4, 16, 64, 256, 1024, 4096, 8192])
    parser.add_argument("--pairs-per-program", nargs="+", type=int, default=[128, 256, 512])
    parser.add_argument("--layer", action="store_true", help="also time the Qwen3 layer with either alignment")
    args = parser.parse_args()
    e, top_k, h, i = SHAPES["qwen3"]
    experts = make_experts("bfloat16", e, h, i) if args.layer else None
    rows = []
    for tokens in args.tokens:
        gen = torch.Generator(device=DEVICE).manual_seed(tokens)
        logits = torch.randn(tokens, e, device=DEVICE, generator=gen).to(DTYPE)
        weights, ids = moe_route(logits, top_k, True)
        for block_m in (16, 64):
            row = align_row(ids, e, block_m, args.pairs_per_program)
            rows.append(row)
            splits = " ".join(f"{n}:{us:.1f}" for n, us in row["split_us"].items())
            print(f"T={tokens:5d} BLOCK_M={block_m:3d}: torch {row['torch_us']:6.1f} us  triton {row['triton_us']:6.1f} us"
                  f"  (pairs/program {splits})", flush=True)  # fmt: skip
        if experts is not None:
            x = torch.randn(tokens, h, device=DEVICE, generator=gen).to(DTYPE)
            rows.append(layer_row(x, experts, weights, ids))
            print(f"T={tokens:5d} layer: {rows[-1]['layer_us']:.1f} us "
                  f"(torch alignment {rows[-1]['layer_torch_align_us']:.1f} us)", flush=True)  # fmt: skip
        args.out.write_text(json.dumps(dict(device=device_name(), torch=torch.__version__, rows=rows), indent=1))


if __name__ == "__main__":
    main()
