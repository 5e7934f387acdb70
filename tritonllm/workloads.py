"""Workloads that `python -m tritonllm.run` can run, and the figures it reports for them."""

from __future__ import annotations

import dataclasses
import json
import random
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tritonllm.entrypoints.llm import LLM
from tritonllm.metrics.stats import PREFIX, Counter, counter_growth, run_counters
from tritonllm.outputs import RequestOutput
from tritonllm.sampling_params import SamplingParams
from tritonllm.workload_config import parse_workload


@dataclass
class WorkloadResult:
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    elapsed_s: float

    @staticmethod
    def of(outputs: list[RequestOutput], elapsed_s: float) -> WorkloadResult:
        prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
        output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        return WorkloadResult(len(outputs), prompt_tokens, output_tokens, elapsed_s)

    def summary(self) -> dict[str, float]:
        return {
            "num_requests": self.num_requests,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "elapsed_s": round(self.elapsed_s, 4),
            "output_tok_per_s": round(self.output_tokens / self.elapsed_s, 2),
            "total_tok_per_s": round((self.prompt_tokens + self.output_tokens) / self.elapsed_s, 2),
        }


def run_demo(llm: LLM, workload: dict[str, Any]) -> dict[str, Any]:
    params = SamplingParams(
        temperature=workload["temperature"], max_tokens=workload["max_tokens"], ignore_eos=workload["ignore_eos"]
    )
    start = time.perf_counter()
    outputs = llm.generate(list(workload["prompts"]), params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    for out in outputs:
        print(f"Prompt: {out.prompt!r}\nGenerated: {out.outputs[0].text!r}\n")
    return {**WorkloadResult.of(outputs, elapsed).summary(), "requests": request_rows(outputs)}


def random_requests(workload: dict[str, Any], vocab_size: int, count: int, seed: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) pairs, lengths uniform in the workload's ranges, ids
    uniform in [0, token_id_max) (the whole vocabulary when it is null)."""
    rng = random.Random(seed)
    id_max = min(workload.get("token_id_max") or vocab_size, vocab_size)
    requests = []
    for _ in range(count):
        prompt_len = rng.randint(workload["prompt_len_min"], workload["prompt_len_max"])
        output_len = rng.randint(workload["output_len_min"], workload["output_len_max"])
        requests.append(([rng.randrange(id_max) for _ in range(prompt_len)], output_len))
    return requests


def percentiles(values: list[float], prefix: str) -> dict[str, float]:
    """mean, p50 and p99 of `values` (seconds) as `{prefix}_mean_ms`, ... rounded to microseconds."""
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
    stats = {"mean": sum(ordered) / len(ordered), "p50": pick(0.5), "p99": pick(0.99)}
    return {f"{prefix}_{name}_ms": round(1000 * value, 3) for name, value in stats.items()}


def request_rows(outputs: list[RequestOutput]) -> list[dict[str, Any]]:
    """Per request: its id, prompt and output lengths, TTFT (arrival to first token) and TPOT (first
    token to finish, per later token) in ms (None where not defined): the run's request table."""
    rows = []
    for o in outputs:
        m = o.metrics
        num_tokens = max(len(c.token_ids) for c in o.outputs)
        ttft = tpot = None
        if m is not None and m.first_token_time is not None:
            ttft = round(1000 * (m.first_token_time - m.arrival_time), 3)
            if num_tokens > 1 and m.finished_time is not None:
                tpot = round(1000 * (m.finished_time - m.first_token_time) / (num_tokens - 1), 3)
        rows.append({"request_id": o.request_id, "prompt_tokens": len(o.prompt_token_ids),
                     "output_tokens": num_tokens, "ttft_ms": ttft, "tpot_ms": tpot})  # fmt: skip
    return rows


def latency_summary(outputs: list[RequestOutput]) -> dict[str, float]:
    """TTFT and TPOT (request_rows) over requests: mean, p50, p99."""
    rows = request_rows(outputs)
    ttfts = [r["ttft_ms"] / 1000 for r in rows if r["ttft_ms"] is not None]
    tpots = [r["tpot_ms"] / 1000 for r in rows if r["tpot_ms"] is not None]
    return {**percentiles(ttfts, "ttft"), **percentiles(tpots, "tpot")}


def peak_memory_gib() -> float:
    """Peak device memory allocated by torch on a GPU; the process's peak resident set on CPU."""
    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**30, 3)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)


def engine_run_counters(llm: LLM) -> dict[str, float | None]:
    """The engine's RUN_COUNTERS (metrics/stats.py: CUDA allocations, None off CUDA; GC collections and time)."""
    return run_counters({m.name.removeprefix(PREFIX): m.value for m in llm.get_metrics() if isinstance(m, Counter)})


def run_random(llm: LLM, workload: dict[str, Any]) -> dict[str, Any]:
    """Random-token prompts with random lengths, EOS ignored. Throughput counts the requested
    output tokens over the wall time of the timed `generate` (nano-vllm's and vLLM's measure); each
    of `passes` timed runs is reported (`passes` > 1: the first pass compiles what the warm-up did
    not reach), the headline figures are the first pass's."""
    vocab_size = llm.llm_engine.hf_config.vocab_size
    sampling = {k: workload[k] for k in ("temperature", "top_p", "top_k") if workload.get(k) is not None}
    detokenize = workload.get("detokenize", False)

    levels = workload.get("priority_levels", 1)
    priority_rng = random.Random(workload["seed"] + 2)

    def generate(requests: list[tuple[list[int], int]]) -> tuple[list[RequestOutput], float, dict[str, Any]]:
        """The outputs, the wall time and, with priority levels, TTFT/TPOT per level."""
        prompts = [{"prompt_token_ids": ids} for ids, _ in requests]
        params = [
            SamplingParams(max_tokens=n, ignore_eos=True, seed=i, detokenize=detokenize, **sampling)
            for i, (_, n) in enumerate(requests)
        ]
        priority = [priority_rng.randrange(levels) for _ in requests] if levels > 1 else None
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False, priority=priority)
        elapsed = time.perf_counter() - start
        per_level = {}
        for level in range(levels if priority is not None else 0):
            level_outputs = [o for o, p in zip(outputs, priority) if p == level]
            per_level.update({f"priority{level}_{k}": v for k, v in latency_summary(level_outputs).items()})
        return outputs, elapsed, per_level

    if workload.get("warmup_prompt"):  # nano-vllm's warm-up: one short text request
        llm.generate([workload["warmup_prompt"]], SamplingParams(), use_tqdm=False)
    if workload["warmup_requests"]:
        generate(random_requests(workload, vocab_size, workload["warmup_requests"], workload["seed"] + 1))
    requests = random_requests(workload, vocab_size, workload["num_requests"], workload["seed"])
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    passes, first = [], None
    for _ in range(workload.get("passes", 1)):
        counters = engine_run_counters(llm)
        outputs, elapsed, per_level = generate(requests)
        first = first or outputs
        summary = WorkloadResult.of(outputs, elapsed).summary()
        summary["output_tok_per_s"] = round(sum(n for _, n in requests) / elapsed, 2)  # requested tokens
        # CUDA allocations (the first pass's show a pool still filling), full GC collections and GC time
        growth = counter_growth(counters, engine_run_counters(llm))
        summary.update({k: round(v, 4) for k, v in growth.items() if v is not None})
        passes.append({**summary, **latency_summary(outputs), **per_level})
    result = {**passes[0], "peak_memory_gib": peak_memory_gib(), "detokenize": detokenize, **sampling}
    result["requests"] = request_rows(first)  # the first pass's (the headline figures')
    if len(passes) > 1:
        result["passes"] = passes
    ttfts = [o.metrics.first_token_s for o in first if o.metrics is not None and o.metrics.first_token_s is not None]
    if ttfts:
        result["mean_ttft_s"] = round(sum(ttfts) / len(ttfts), 4)
    if workload["num_requests"] == 1 and ttfts:
        decode_tokens = result["output_tokens"] - 1
        result["decode_tok_per_s"] = round(decode_tokens / (passes[0]["elapsed_s"] - ttfts[0]), 2)
    return result


def run_shared_prefix(llm: LLM, workload: dict[str, Any]) -> dict[str, Any]:
    """Requests sharing one system prompt (`prefix_len` random tokens) followed by `suffix_len`
    distinct tokens each; `output_len` new tokens, EOS ignored. The prefix cache is reset after
    the warm-up, so the timed run starts cold."""
    rng = random.Random(workload["seed"])
    vocab_size = llm.llm_engine.hf_config.vocab_size
    draw = lambda n: [rng.randrange(vocab_size) for _ in range(n)]
    prefix = draw(workload["prefix_len"])
    params = SamplingParams(
        temperature=workload["temperature"], max_tokens=workload["output_len"], ignore_eos=True, detokenize=False
    )
    # warm-up: two full-length prompts, then as many short requests as the timed run so the kernel
    # variants of a large decode batch are compiled before the clock starts
    warmup = [{"prompt_token_ids": draw(workload["prefix_len"] + workload["suffix_len"])} for _ in range(2)]
    llm.generate(warmup, params, use_tqdm=False)
    short = SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False)
    llm.generate([{"prompt_token_ids": draw(16)} for _ in range(workload["num_requests"])], short, use_tqdm=False)
    llm.reset_prefix_cache()
    metrics_before = {m.name: m.value for m in llm.get_metrics()}
    prompts = [{"prompt_token_ids": prefix + draw(workload["suffix_len"])} for _ in range(workload["num_requests"])]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    result = WorkloadResult.of(outputs, elapsed).summary()
    ttfts = [o.metrics.first_token_s for o in outputs]
    result["mean_ttft_s"] = round(sum(ttfts) / len(ttfts), 4)
    metrics = {m.name: m.value for m in llm.get_metrics()}
    queries = metrics["tritonllm:prefix_cache_queries"] - metrics_before["tritonllm:prefix_cache_queries"]
    hits = metrics["tritonllm:prefix_cache_hits"] - metrics_before["tritonllm:prefix_cache_hits"]
    result["prefix_cache_hit_rate"] = round(hits / queries, 4) if queries else 0.0
    result["requests"] = request_rows(outputs)
    return result


WORKLOADS = {"demo": run_demo, "random": run_random, "shared_prefix": run_shared_prefix}


def run_workload(llm: LLM, workload: dict[str, Any]) -> dict[str, Any]:
    """The workload's figures; under "requests", its per-request table (request_rows). The workload
    is checked against its typed config (workload_config.py) first."""
    parsed = dataclasses.asdict(parse_workload(workload))
    kind = parsed["kind"]
    if kind not in WORKLOADS:
        raise ValueError(f"workload.kind={kind!r} needs no engine: run it through `python -m tritonllm.run`")
    return WORKLOADS[kind](llm, parsed)


def run_kernel_bench(workload: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The kernel benchmarks of tests/benchmarks (GPU only) in a pytest subprocess; pytest-benchmark's
    JSON goes to run_dir/kernel_bench.json, the figures of each benchmark (its extra_info) into the
    results."""
    parsed = parse_workload(workload)
    if not torch.cuda.is_available():
        raise ValueError("workload kernel_bench times GPU kernels: run it on a machine with a GPU")
    root = Path(__file__).resolve().parents[1]
    out = run_dir / "kernel_bench.json"
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-o", "addopts=", str(root / parsed.tests),
           f"--benchmark-json={out}", *(["-k", parsed.select] if parsed.select else [])]  # fmt: skip
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"kernel benchmarks failed ({' '.join(cmd)}):\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    benchmarks = json.loads(out.read_text())["benchmarks"]
    return {"num_benchmarks": len(benchmarks), "benchmarks": {b["name"]: b["extra_info"] for b in benchmarks}}
