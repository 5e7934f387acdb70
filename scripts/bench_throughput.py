"""Offline throughput benchmark with vLLM's flags (`vllm bench throughput --dataset-name random`).

    python scripts/bench_throughput.py --model DIR --num-prompts 256 --input-len 562 --output-len 562 \
        --random-range-ratio 0.82 --temperature 0.6 [--no-detokenize] [--output-json OUT.json]

Random token-id prompts, lengths uniform in [len * (1 - ratio), len * (1 + ratio)], EOS ignored.
Reports output and total tok/s (requested output tokens over the timed generate's wall time),
TTFT and TPOT (mean, p50, p99) and peak memory. Every `LLM(...)` argument is a flag too
(`--max-model-len`, `--enforce-eager`, `--async-scheduling/--no-async-scheduling`, ...). The same
workload runs from Hydra: `python -m tritonllm.run +experiment=nanovllm_bench` (workload=random).
"""

from __future__ import annotations

import argparse
import json
import math

from tritonllm.entrypoints.cli import add_llm_flags, llm_kwargs
from tritonllm.entrypoints.llm import LLM
from tritonllm.run import environment
from tritonllm.workloads import run_random


def length_range(length: int, ratio: float) -> tuple[int, int]:
    """vLLM's random dataset: lengths uniform in [floor(length * (1 - ratio)), ceil(length * (1 + ratio))]."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"--random-range-ratio {ratio} must be in [0, 1)")
    return max(1, math.floor(length * (1 - ratio))), math.ceil(length * (1 + ratio))


def workload_from_args(args: argparse.Namespace) -> dict:
    prompt_min, prompt_max = length_range(args.input_len, args.random_range_ratio)
    output_min, output_max = length_range(args.output_len, args.random_range_ratio)
    return {
        "kind": "random",
        "num_requests": args.num_prompts,
        "prompt_len_min": prompt_min,
        "prompt_len_max": prompt_max,
        "output_len_min": output_min,
        "output_len_max": output_max,
        "token_id_max": args.token_id_max,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "detokenize": args.detokenize,
        "seed": args.seed,
        "warmup_prompt": args.warmup_prompt,
        "warmup_requests": args.warmup_requests,
        "passes": args.passes,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="HF model folder; none: the tiny built-in Llama")
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--random-range-ratio", type=float, default=0.0)
    parser.add_argument("--temperature", type=float, default=1.0, help="vLLM's default sampling: 1.0")
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--detokenize", action=argparse.BooleanOptionalAction, default=True,
                        help="decode the outputs to text, as users get them (vLLM: on unless --disable-detokenize)")  # fmt: skip
    parser.add_argument("--token-id-max", type=int, default=None, help="prompt ids in [0, N); default: the vocabulary")
    parser.add_argument("--warmup-prompt", default="Benchmark: ", help="a short request run first ('' for none)")
    parser.add_argument("--warmup-requests", type=int, default=0, help="random requests run first")
    parser.add_argument("--passes", type=int, default=1, help="timed runs of the same requests, each reported")
    parser.add_argument("--output-json", default=None)
    add_llm_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    llm = LLM(**llm_kwargs(args))
    results = {**run_random(llm, workload_from_args(args)), "model": llm.llm_engine.model_path, **environment()}
    requests = results.pop("requests")  # per-request table: in the JSON file, not on stdout
    print(json.dumps(results, indent=2))
    print(
        f"{results['num_requests']} requests: {results['output_tok_per_s']:.1f} output tok/s, "
        f"{results['total_tok_per_s']:.1f} total tok/s, TTFT p50 {results.get('ttft_p50_ms')} ms, "
        f"TPOT p50 {results.get('tpot_p50_ms')} ms, peak memory {results['peak_memory_gib']} GiB"
    )
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"args": vars(args), "results": results, "requests": requests}, f, indent=2)
    return results


if __name__ == "__main__":
    main()
