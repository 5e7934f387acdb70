"""The 4-bit prefill's dequantize pass (kernels/gemm_dequant.py) at several tiles, Llama-3-8B layer shapes, int4 g128
and MXFP4, weights cold in L2 (scripts/cold_l2.py), CUDA-graph replay. Reports us a layer (the four linears) and
the HBM rate (packed weight, scales and zero points read, the bf16 weight written).

Beyond the 4-bit kernels' rows a layer's linears dequantize their whole weight first: on the H200 214 us a layer at
M = 512 (experiments/quant4/README.md, session 40), ~2.6 TB/s of its 4.8, a third of the int4 prefill's layer. The
tile was 64 x 256 (4 warps) from session 20, chosen against 32 x 128 only; session 41's sweep on an H100 (12 tiles)
made it 16 x 512 (4 warps): 206.0 / 209.0 us a layer (int4 / MXFP4) against 216.4 / 220.7. Not yet swept on the H200.

    python experiments/quant4/dequant/sweep.py OUT.json [--tiles 64:256:4 32:256:4 ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from scripts.cold_l2 import copies, nbytes, rotate  # noqa: E402
from tritonllm.kernels import gemm as g  # noqa: E402
from tritonllm.kernels import gemm_dequant, reference  # noqa: E402
from tritonllm.kernels.quant_formats import FP4, INT4, QuantScheme  # noqa: E402
from tritonllm.quantization.quantize import quantize_weight  # noqa: E402

SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]
CANDIDATES = ["16:512:4", "64:256:4", "32:256:4", "64:128:4", "128:256:8", "64:256:8", "32:512:4", "64:512:8",
         "128:128:4", "32:128:2", "16:256:2", "32:256:2"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--tiles", nargs="+", default=CANDIDATES, help="ROWS:COLUMNS:WARPS")
    args = parser.parse_args()
    rows, default = [], gemm_dequant.TILES
    for fmt, scheme in [("int4", QuantScheme(INT4, "group", "none", group_size=128)),
                        ("mxfp4", QuantScheme(FP4, "mx", "none"))]:  # fmt: skip
        sargs = g.scale_args(scheme)
        totals = {}
        for layer, n, k in SHAPES:
            q = quantize_weight(torch.randn(n, k, device="cuda"), scheme)
            expected = reference.dequantize_weight(q).to(torch.bfloat16)
            moved = nbytes(q) + n * k * 2
            q_copies = copies(q)
            for spec in args.tiles:
                gemm_dequant.TILES = tuple(int(v) for v in spec.split(":"))

                def make(w, k=k, sargs=sargs):
                    return lambda: gemm_dequant.dequantize(w.data, w.scale, w.zeros, k, sargs["b_decode"],
                                                           sargs["group_k"], torch.bfloat16)  # fmt: skip

                ok = torch.equal(make(q)(), expected)
                us = triton.testing.do_bench_cudagraph(rotate(make, q_copies)) * 1e3
                totals[spec] = totals.get(spec, 0.0) + us
                rows.append(dict(format=fmt, layer=layer, n=n, k=k, tiles=spec, us=us, tb_s=moved / us / 1e6,
                                 exact=ok, device=torch.cuda.get_device_name()))  # fmt: skip
                print(f"{fmt} {layer} {n}x{k} {spec}: {us:.1f} us {moved / us / 1e6:.2f} TB/s"
                      + ("" if ok else " MISMATCH"), flush=True)  # fmt: skip
            gemm_dequant.TILES = default
            del q_copies
        best = min(totals, key=totals.get)
        print(f"{fmt} layer: " + ", ".join(f"{s} {t:.1f}" for s, t in totals.items()) + f" us; best {best}")
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
