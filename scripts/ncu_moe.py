"""One fused-MoE decode layer run a few times, for Nsight Compute (the GPU):

    ncu --clock-control none -k regex:moe_gemv --launch-skip 4 --launch-count 2 --section ... \
        python3 scripts/ncu_moe.py gptoss mxfp4 1

The experts and routing are bench_moe.py's (random weights, MXFP4 / FP8-block quantized from them);
the layer runs `--calls` times (default 4: the first two compile and warm, ncu skips them by
--launch-skip), each call the tiles the table or the defaults pick (kernels/moe_tiles.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_moe import SCHEMES, SHAPES, layer_operands, make_experts  # noqa: E402

from tritonllm.kernels.moe import fused_moe, moe_tiles_for  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shape", choices=list(SHAPES))
    parser.add_argument("kind", choices=list(SCHEMES))
    parser.add_argument("tokens", type=int)
    parser.add_argument("--calls", type=int, default=4)
    args = parser.parse_args()
    e, top_k, h, i = SHAPES[args.shape]
    experts = make_experts(args.kind, e, h, i)
    x, _, weights, ids, _ = layer_operands(args.shape, args.tokens)
    print(args.shape, args.kind, args.tokens, moe_tiles_for(x, experts["w13"], experts["w2"], top_k), flush=True)
    for _ in range(args.calls):
        fused_moe(x, experts["w13"], experts["w2"], weights, ids)
    if torch.cuda.is_available():
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
