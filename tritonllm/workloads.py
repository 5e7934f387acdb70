"""Workloads that `python -m tritonllm.run` can run, and the figures it reports for them."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from tritonllm.entrypoints.llm import LLM
from tritonllm.outputs import RequestOutput
from tritonllm.sampling_params import SamplingParams


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
    result = WorkloadResult.of(outputs, elapsed)
    return result.summary()


def random_requests(workload: dict[str, Any], vocab_size: int, count: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        prompt_len = rng.randint(workload["prompt_len_min"], workload["prompt_len_max"])
        output_len = rng.randint(workload["output_len_min"], workload["output_len_max"])
        requests.append(([rng.randrange(vocab_size) for _ in range(prompt_len)], output_len))
    return requests


def run_random(llm: LLM, workload: dict[str, Any]) -> dict[str, Any]:
    vocab_size = llm.llm_engine.hf_config.vocab_size

    def generate(requests: list[tuple[list[int], int]]):
        prompts = [{"prompt_token_ids": ids} for ids, _ in requests]
        params = [
            SamplingParams(temperature=workload["temperature"], max_tokens=n, ignore_eos=True, seed=i, detokenize=False)
            for i, (_, n) in enumerate(requests)
        ]
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return outputs, time.perf_counter() - start

    if workload["warmup_requests"]:
        generate(random_requests(workload, vocab_size, workload["warmup_requests"], workload["seed"] + 1))
    outputs, elapsed = generate(random_requests(workload, vocab_size, workload["num_requests"], workload["seed"]))
    result = WorkloadResult.of(outputs, elapsed).summary()
    ttfts = [o.metrics.first_token_s for o in outputs if o.metrics is not None and o.metrics.first_token_s is not None]
    if ttfts:
        result["mean_ttft_s"] = round(sum(ttfts) / len(ttfts), 4)
    if workload["num_requests"] == 1 and ttfts:
        decode_tokens = result["output_tokens"] - 1
        result["decode_tok_per_s"] = round(decode_tokens / (elapsed - ttfts[0]), 2)
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
    return result


WORKLOADS = {"demo": run_demo, "random": run_random, "shared_prefix": run_shared_prefix}


def run_workload(llm: LLM, workload: dict[str, Any]) -> dict[str, Any]:
    kind = workload["kind"]
    if kind not in WORKLOADS:
        raise ValueError(f"workload.kind={kind!r} is not one of {sorted(WORKLOADS)}")
    return WORKLOADS[kind](llm, workload)
