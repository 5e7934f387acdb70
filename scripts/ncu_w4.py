"""One Llama-3-8B layer's 4-bit GEMV (M = 1) run a few times, for Nsight Compute (the GPU):

    ncu --clock-control none -k regex:w4_gemv --launch-skip 2 --launch-count 2 --section ... \
        python3 scripts/ncu_w4.py gate_up int4

Which GEMV runs is gemm()'s choice: the register-fed Gluon kernel (kernels/gemv_w4_sm90.py), or with
TRITONLLM_W4_GEMV_TMA set the TMA-fed one (kernels/gemv_w4_tma_sm90.py). Weights are random, quantized per
the format (int4: groups of 128 with zero points; mxfp4: e2m1 with e8m0 scales per 32); ncu flushes the caches
between its replays, so each profiled launch reads its weight cold, as a decode step does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tritonllm.kernels import gemm as g  # noqa: E402
from tritonllm.kernels.quant_formats import FP4, INT4, QuantScheme  # noqa: E402
from tritonllm.quantization.quantize import quantize_weight  # noqa: E402

LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}  # Llama-3-8B
SCHEMES = {"int4": QuantScheme(INT4, "group", "none", group_size=128), "mxfp4": QuantScheme(FP4, "mx", "none")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("layer", choices=list(LAYERS))
    parser.add_argument("format", choices=list(SCHEMES))
    parser.add_argument("--calls", type=int, default=4)
    args = parser.parse_args()
    n, k = LAYERS[args.layer]
    scheme = SCHEMES[args.format]
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = quantize_weight(torch.randn(n, k, device="cuda", generator=gen) * 0.02, scheme)
    x = torch.randn(1, k, device="cuda", generator=gen).to(torch.bfloat16)
    for _ in range(args.calls):
        g.gemm(x, weight.data, None, b_scale=weight.scale, b_zero=weight.zeros, sm90="always",
               **g.scale_args(scheme))  # fmt: skip
    torch.cuda.synchronize()
    print(args.layer, args.format, n, k, flush=True)


if __name__ == "__main__":
    main()
