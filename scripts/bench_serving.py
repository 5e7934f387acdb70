"""Serving benchmark against a running OpenAI-compatible server (ours or vLLM's), with vLLM's
`benchmarks/benchmark_serving.py` flags and metrics:

    python scripts/bench_serving.py --base-url http://127.0.0.1:8000 --model M --num-prompts 500 \
        --random-input-len 512 --random-output-len 128 --request-rate 16 [--max-concurrency 64] \
        [--api-key KEY] [--save-result out.json]

Requests are /v1/completions with random token-id prompts (`--token-id-max` keeps them inside the
tokenizer's vocabulary), streamed (`stream_options.include_usage`), `ignore_eos` so each produces
exactly its output length, sent at Poisson arrivals of `--request-rate` per second (inf: all at
once), at most `--max-concurrency` in flight. Reported as vLLM does: request throughput, output and
total tok/s, TTFT (first streamed chunk), TPOT ((latency - TTFT) / (output tokens - 1)) and
inter-token latency (gaps between streamed chunks), each mean / median / p99, in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tritonllm.metrics.stats import PREFIX, RUN_COUNTERS, counter_growth, run_counters


@dataclass
class RequestResult:
    ok: bool
    prompt_len: int
    requested_tokens: int
    output_tokens: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    error: str = ""


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]

    return {"mean": sum(ordered) / len(ordered) * 1e3, "median": pick(0.5) * 1e3, "p99": pick(0.99) * 1e3}


async def _one(client: httpx.AsyncClient, model: str, prompt: list[int], output_len: int) -> RequestResult:
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "ignore_eos": True, "temperature": 0.8,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    result = RequestResult(ok=False, prompt_len=len(prompt), requested_tokens=output_len)
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                result.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"
                return result
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.perf_counter()
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    result.error = chunk["error"]["message"]
                    return result
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if not chunk.get("choices"):
                    continue
                if result.ttft_s == 0.0:
                    result.ttft_s = now - start
                else:
                    result.itl_s.append(now - last)
                last = now
        result.latency_s = time.perf_counter() - start
        result.ok = True
    except httpx.HTTPError as e:
        result.error = f"{type(e).__name__}: {e}"
    return result


async def _run_counters(client: httpx.AsyncClient) -> dict[str, float | None]:
    """RUN_COUNTERS from the server's GET /metrics (each None if absent)."""
    try:
        response = await client.get("/metrics")
        response.raise_for_status()
    except httpx.HTTPError:
        return dict.fromkeys(RUN_COUNTERS)
    return run_counters_in(response.text)


def run_counters_in(text: str) -> dict[str, float | None]:
    """metrics/stats.py's RUN_COUNTERS in a Prometheus exposition (its counters' `_total` samples, summed
    over label sets; None where absent)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(PREFIX) and sample.name.endswith("_total"):
                name = sample.name[len(PREFIX) : -len("_total")]
                totals[name] = totals.get(name, 0.0) + sample.value
    return run_counters(totals)


async def run(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    low_in = max(1, int(args.random_input_len * (1 - args.random_range_ratio)))
    low_out = max(1, int(args.random_output_len * (1 - args.random_range_ratio)))
    requests = [
        ([rng.randint(args.token_id_min, args.token_id_max) for _ in range(rng.randint(low_in, args.random_input_len))],
         rng.randint(low_out, args.random_output_len))
        for _ in range(args.num_prompts)
    ]  # fmt: skip
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.max_concurrency or args.num_prompts)
    gate = asyncio.Semaphore(args.max_concurrency or args.num_prompts)
    async with httpx.AsyncClient(
        base_url=args.base_url, headers=headers, timeout=args.timeout, limits=limits
    ) as client:
        if args.warmup:  # a prompt of its own: one of the run's would be served from the prefix cache
            await _one(client, args.model, [args.token_id_min] * len(requests[0][0]), 4)

        async def limited(prompt: list[int], output_len: int) -> RequestResult:
            async with gate:
                return await _one(client, args.model, prompt, output_len)

        counters_before = await _run_counters(client)
        tasks = []
        start = time.perf_counter()
        for prompt, output_len in requests:
            tasks.append(asyncio.ensure_future(limited(prompt, output_len)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        counters_after = await _run_counters(client)
    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    tpots = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    summary = {
        "base_url": args.base_url, "model": args.model, "num_prompts": args.num_prompts,
        "request_rate": args.request_rate, "max_concurrency": args.max_concurrency,
        "completed": len(done), "failed": len(results) - len(done), "duration_s": duration,
        "request_throughput": len(done) / duration, "output_throughput": output_tokens / duration,
        "total_token_throughput": (output_tokens + sum(r.prompt_len for r in done)) / duration,
        "total_output_tokens": output_tokens, "total_input_tokens": sum(r.prompt_len for r in done),
        "ttft_ms": _percentiles([r.ttft_s for r in done]), "tpot_ms": _percentiles(tpots),
        "itl_ms": _percentiles([g for r in done for g in r.itl_s]),
        "e2e_latency_ms": _percentiles([r.latency_s for r in done]),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        # the server's device allocations, full GC collections and GC time during the run (None: no such
        # metric, e.g. no device allocator on a CPU server)
        **counter_growth(counters_before, counters_after),
    }  # fmt: skip
    if args.save_detailed:
        summary["requests"] = [asdict(r) for r in results]
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--request-rate", type=float, default=float("inf"), help="Poisson arrivals per second")
    parser.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    parser.add_argument("--random-input-len", type=int, default=1024)
    parser.add_argument("--random-output-len", type=int, default=128)
    parser.add_argument("--random-range-ratio", type=float, default=0.0, help="lengths drawn from [len*(1-r), len]")
    parser.add_argument("--token-id-min", type=int, default=100)
    parser.add_argument("--token-id-max", type=int, default=10000, help="keep prompts inside the vocabulary")
    parser.add_argument(
        "--seed", type=int, default=0,
        help="the prompts' seed: a second run with the same seed against the same server repeats its prompts, "
        "which the prefix cache then serves (prefix_cache_hit_rate in the result)",
    )  # fmt: skip
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--save-result", type=Path, default=None)
    parser.add_argument("--save-detailed", action="store_true", help="keep every request's timings in the JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    summary = asyncio.run(run(args))
    for key in (
        "completed",
        "failed",
        "duration_s",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
    ):
        print(f"{key:24s} {summary[key]:.2f}" if isinstance(summary[key], float) else f"{key:24s} {summary[key]}")
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms"):
        stats = summary[key]
        print(f"{key:24s} mean {stats['mean']:.2f}  median {stats['median']:.2f}  p99 {stats['p99']:.2f}")
    for key in (*RUN_COUNTERS, "prefix_cache_hit_rate"):
        if summary[key] is not None:
            print(f"{key:24s} {summary[key]:.3g}")
    if summary["errors"]:
        print("errors:", summary["errors"])
    if args.save_result:
        args.save_result.write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
