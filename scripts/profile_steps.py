"""GPU idle time and kernel time per engine step, from a torch profiler trace of a window of steps.

Runs nano-vllm's workload by default (256 requests, lengths uniform in 100-1024, temperature 0.6;
texts decoded at the end as offline `generate` does, or every step with --streaming) and records
`--steps` engine steps with the torch profiler:
  --phase decode   after every prompt is prefilled (a decode-heavy window: graphs replay);
  --phase prefill  from the first step (prefill chunks and mixed steps: eager forward).
It reports the share of the window in which no kernel or copy ran on the GPU, the host time per
step and, with --kernel-table N, the N kernels that take the most GPU time (us per step).
Fixed lengths (--prompt-len, --output-len) and --num-requests 1 give a batch-1 profile.

    python scripts/profile_steps.py --model DIR [--no-async-scheduling] [--phase prefill] [--kernel-table 15]
        [--output-json OUT.json] [--trace OUT.json.gz]
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from tritonllm import LLM, SamplingParams
from tritonllm.sampling_params import RequestOutputKind


def busy_fraction(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """(union of the intervals / the window they span, the window) for [start, end] pairs (us)."""
    if not intervals:
        return 0.0, 0.0
    intervals.sort()
    busy, (cur_start, cur_end) = 0.0, intervals[0]
    for start, end in intervals[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    window = max(e for _, e in intervals) - intervals[0][0]
    return busy / window, window


def kernel_table(events: list, steps: int, top: int, count: bool = False) -> dict[str, float]:
    """GPU time per step of each kernel name (summed over its launches), the `top` largest; with
    `count`, the launches per step of those same kernels instead."""
    totals: dict[str, float] = {}
    launches: dict[str, int] = {}
    for e in events:
        totals[e.name] = totals.get(e.name, 0.0) + (e.time_range.end - e.time_range.start)
        launches[e.name] = launches.get(e.name, 0) + 1
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:top]
    if count:
        return {name[:120]: round(launches[name] / steps, 1) for name, _ in ranked}
    return {name[:120]: round(total / steps, 1) for name, total in ranked}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--piecewise-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="prefill/mixed steps from graphs",
    )
    parser.add_argument(
        "--streaming", action="store_true", help="every step's outputs, text streamed (the server's path)"
    )
    parser.add_argument("--phase", choices=["decode", "prefill"], default="decode")
    parser.add_argument(
        "--warmup-requests",
        type=int,
        default=0,
        help="requests of the same lengths run to completion first (a warm prefill: kernels compiled)",
    )
    parser.add_argument("--prompt-len", type=int, default=None, help="fixed prompt length (default 100-1024)")
    parser.add_argument("--output-len", type=int, default=None, help="fixed output length (default 300-1024)")
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--load-format", default="auto", help="dummy: random weights (a folder with config.json)")
    parser.add_argument(
        "--pdl", action=argparse.BooleanOptionalAction, default=True, help="programmatic dependent launch"
    )
    parser.add_argument("--quantization", default=None, help="e.g. fp8, int4, mxfp4 (online from bf16 weights)")
    parser.add_argument(
        "--kernel",
        action="append",
        default=[],
        metavar="OP=IMPL",
        help="a registered kernel for an op, e.g. linear=triton",
    )
    parser.add_argument("--fuse-norm-into-gemm", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--fuse-gated-mlp", action="store_true", help="fuse_gated_activation + fuse_down_input_quant")
    parser.add_argument("--fuse-moe-router", action=argparse.BooleanOptionalAction, default=True,
                        help="a MoE router's GEMM and routing in one kernel at decode sizes")  # fmt: skip
    parser.add_argument("--fuse-norm-into-router", action=argparse.BooleanOptionalAction, default=False,
                        help="the add + RMSNorm before a MoE block in its router's launch (one or two tokens)")  # fmt: skip
    parser.add_argument("--prefetch-weights", action=argparse.BooleanOptionalAction, default=True,
                        help="decode steps stream weights into L2 ahead of their GEMVs")  # fmt: skip
    parser.add_argument("--decode-group-quant", action=argparse.BooleanOptionalAction, default=True,
                        help="FP8 o_proj / down inputs per 1 x 128 group at decode sizes (false: per token)")  # fmt: skip
    parser.add_argument("--fold-rope-into-attention", action=argparse.BooleanOptionalAction, default=False,
                        help="split-KV decode rotates q and writes the step's K/V itself (no rope_kv_write launch)")  # fmt: skip
    parser.add_argument("--kernel-table", type=int, default=0, help="report the N kernels taking most GPU time")
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--trace", default=None, help="also write the Chrome trace here")
    args = parser.parse_args()
    llm = LLM(
        model=args.model,
        load_format=args.load_format,
        max_model_len=args.max_model_len,
        async_scheduling=args.async_scheduling,
        piecewise_graphs=args.piecewise_graphs,
        quantization=args.quantization,
        pdl=args.pdl,
        fuse_norm_into_gemm=args.fuse_norm_into_gemm,
        fuse_gated_activation=args.fuse_gated_mlp,
        fuse_down_input_quant=args.fuse_gated_mlp,
        fuse_moe_router=args.fuse_moe_router,
        fuse_norm_into_router=args.fuse_norm_into_router,
        decode_group_quant=args.decode_group_quant,
        fold_rope_into_attention=args.fold_rope_into_attention,
        prefetch_weights=args.prefetch_weights,
        kernels=dict(choice.split("=", 1) for choice in args.kernel) or None,
    )
    engine = llm.llm_engine
    rng = random.Random(0)
    prompt = lambda: [rng.randrange(10000) for _ in range(args.prompt_len or rng.randint(100, 1024))]  # noqa: E731
    for i in range(args.warmup_requests):
        params = SamplingParams(temperature=args.temperature, ignore_eos=True, max_tokens=args.output_len or 16)
        engine.add_request(f"warmup{i}", prompt(), params)
    while engine.has_unfinished_requests():
        engine.step()
    kind = RequestOutputKind.CUMULATIVE if args.streaming else RequestOutputKind.FINAL_ONLY
    for i in range(args.num_requests):
        tokens = prompt()  # drawn before max_tokens: the same random workload as before
        max_tokens = args.output_len or rng.randint(300, 1024)
        params = SamplingParams(
            temperature=args.temperature, ignore_eos=True, max_tokens=max_tokens, seed=i, output_kind=kind
        )
        engine.add_request(str(i), tokens, params)
    if args.phase == "decode":
        while engine.scheduler.waiting or any(
            r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running
        ):
            engine.step()
        for _ in range(20):  # settle into pure decode
            engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # GPU activity only: little host overhead
        start = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    gpu_events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    intervals = [(e.time_range.start, e.time_range.end) for e in gpu_events]
    fraction, window_us = busy_fraction(intervals)
    results = {
        "model": args.model,
        "quantization": args.quantization,
        "kernels": args.kernel,
        "pdl": args.pdl,
        "phase": args.phase,
        "async_scheduling": engine.async_scheduling,
        "streaming": args.streaming,
        "num_running": len(engine.scheduler.running),
        "steps": args.steps,
        "step_ms": round(1000 * elapsed / args.steps, 3),
        "gpu_window_ms": round(window_us / 1000, 3),
        "gpu_busy_fraction": round(fraction, 4),
        "gpu_idle_percent": round(100 * (1 - fraction), 2),
        "gpu_busy_ms_per_step": round(fraction * window_us / 1000 / args.steps, 3),
        "device": torch.cuda.get_device_name(),
    }
    results["kernel_launches_per_step"] = round(len(gpu_events) / args.steps, 1)
    if args.kernel_table:
        results["kernels_us_per_step"] = kernel_table(gpu_events, args.steps, args.kernel_table)
        results["launches_per_step"] = kernel_table(gpu_events, args.steps, args.kernel_table, count=True)
    print(json.dumps(results, indent=2))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=2)
    if args.trace:
        prof.export_chrome_trace(args.trace)
    for request_id in list(engine.output_processor.groups):
        engine.abort_request(request_id)


if __name__ == "__main__":
    main()
