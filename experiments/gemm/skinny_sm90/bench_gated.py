"""Time the gated epilogue of the skinny sm90 GEMM (kernels/gemm_skinny_sm90.py, GATED 1 / 2) against the GEMM
and the SiLU-mul + quantization kernel it would replace, at Llama-3-8B's gate_up / down and M = 1 (FP8 W8A8).

    PYTHONPATH=/tmp/site:$PWD python3 experiments/gemm/skinny_sm90/bench_gated.py   # on the H200

Each figure is us per launch over CUDA-graph replays of 20 launches (PDL on, as in the decode step).
Results: experiments/gemm/e2e/session18/gated_gemm_microbench.txt.
"""

from __future__ import annotations

import torch

from tritonllm.kernels import gemm as g
from tritonllm.kernels import gemm_skinny_fused_sm90 as fz
from tritonllm.kernels import gemm_skinny_sm90 as sk
from tritonllm.kernels import launch
from tritonllm.kernels.activation import silu_and_mul_quant
from tritonllm.kernels.quant import quantize_per_token
from tritonllm.kernels.quant_formats import QuantScheme
from tritonllm.quantization.quantize import quantize_weight

FP8 = QuantScheme(torch.float8_e4m3fn, "channel", "token")
LAUNCHES = 20


def us_per_call(fn, reps: int = 200) -> float:
    """Mean time of fn over CUDA-graph replays of LAUNCHES calls, in us."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.Stream()):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            for _ in range(LAUNCHES):
                fn()
    torch.cuda.synchronize()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps // LAUNCHES):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / reps


def main() -> None:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    launch.arrival_counters(dev)
    x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    gate_up = quantize_weight(torch.randn(28672, 4096, device=dev) * 0.02, FP8)
    down = quantize_weight(torch.randn(4096, 14336, device=dev) * 0.02, FP8)
    q, scale = quantize_per_token(x, torch.float8_e4m3fn)

    def fp8_gemm(a, a_scale, w):
        return g.gemm(a, w.data, out_dtype=torch.bfloat16, a_scale=a_scale, sm90="always", **g.scale_args(FP8),
                      b_scale=w.scale)  # fmt: skip

    def gated(quant_dtype):
        return fz.gated_skinny_gemm_sm90(q, gate_up.data, None, scale, gate_up.scale, torch.bfloat16, quant_dtype,
                                         launch.pdl_launch())  # fmt: skip

    y = fp8_gemm(q, scale, gate_up)
    h = silu_and_mul_quant(y, torch.float8_e4m3fn)

    def unfused_chain():
        act = silu_and_mul_quant(fp8_gemm(q, scale, gate_up), torch.float8_e4m3fn)
        fp8_gemm(act.data, act.scale, down)

    def fused_chain():
        hq, hs = gated(torch.float8_e4m3fn)
        fp8_gemm(hq, hs, down)

    res = {
        "gate_up": us_per_call(lambda: fp8_gemm(q, scale, gate_up)),
        "silu_quant": us_per_call(lambda: silu_and_mul_quant(y, torch.float8_e4m3fn)),
        "gated1": us_per_call(lambda: gated(None)),
        "gated2": us_per_call(lambda: gated(torch.float8_e4m3fn)),
        "down": us_per_call(lambda: fp8_gemm(h.data, h.scale, down)),
        "real_unfused": us_per_call(unfused_chain),
        "real_fused": us_per_call(fused_chain),
    }
    for plan in (sk.Plan(128, 1, 6), sk.Plan(128, 1, 4), sk.Plan(128, 1, 8), sk.Plan(256, 1, 4, 8)):
        sk.PLAN_OVERRIDE = plan
        tag = f"{plan.block_n}_{plan.stages}_{plan.warps}"
        res[f"gated2_{tag}"] = us_per_call(lambda: gated(torch.float8_e4m3fn))
        res[f"gate_up_{tag}"] = us_per_call(lambda: fp8_gemm(q, scale, gate_up))
    sk.PLAN_OVERRIDE = None
    print(1, {k: round(v, 2) for k, v in res.items()})


if __name__ == "__main__":
    main()
