"""Tensor parallelism end to end on CPU: gloo, worker processes, the tiny models.

Each architecture (the mixtures of experts too) runs the same workload with tensor_parallel_size 1 and 2 (Qwen3 also 4: one KV
head per two ranks, replicated): chunked prefill (32-token steps), prefix caching (prompts share
two blocks) and preemption (a KV cache of 12 blocks) all happen, and the split model must give the
same greedy tokens and the same logprobs (sampled and prompt) within float32 rounding. The torch
reference kernels serve (the kernels are not under test; the interpreter would be slow).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tritonllm import LLM, SamplingParams
from tritonllm.distributed.executor import WorkerFailedError
from tritonllm.models.tiny import TINY_ARCHITECTURES, TINY_MOE_ARCHITECTURES, tiny_model_path

PREFIX = list(range(40, 56))  # two 8-token blocks every prompt shares
PROMPTS = [PREFIX + [(97 * i + 13 * j) % 600 + 7 for j in range(3 + 5 * i)] for i in range(6)]
# prompt logprobs on half the requests (a request asking for them is not served from the prefix cache)
PARAMS = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3, prompt_logprobs=2 if i % 2 else None)
          for i in range(len(PROMPTS))]  # fmt: skip
# chunked prefill, prefix caching and preemption all on and exercised
ENGINE_ARGS = dict(max_model_len=64, block_size=8, num_gpu_blocks_override=12, max_num_batched_tokens=32,
                   max_num_seqs=4, enable_prefix_caching=True, kernel_backend="torch_ref")  # fmt: skip


def _run(llm: LLM):
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    engine = llm.llm_engine
    return outputs, engine.scheduler.num_preemptions, engine.kv_cache.prefix_cache_hits


def _close(a: float, b: float) -> bool:
    """Equal within float32 rounding of the sums the ranks split (relative to the logprob's size)."""
    return abs(a - b) <= 1e-4 * max(1.0, abs(a))


def _assert_same(reference, split) -> None:
    for want, got in zip(reference, split, strict=True):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        pairs = list(zip(want.outputs[0].logprobs, got.outputs[0].logprobs))
        if want.prompt_logprobs is not None:
            pairs += list(zip(want.prompt_logprobs[1:], got.prompt_logprobs[1:], strict=True))
        for w, g in pairs:
            assert w.keys() == g.keys()
            assert all(_close(w[t].logprob, g[t].logprob) and w[t].rank == g[t].rank for t in w), (w, g)


@pytest.fixture(scope="module", params=TINY_ARCHITECTURES)
def architecture(request) -> str:
    return request.param


def _split_matches_whole(path: str, tensor_parallel_size: int, async_scheduling: bool = False) -> None:
    args = dict(ENGINE_ARGS, async_scheduling=async_scheduling)
    whole, preemptions, hits = _run(LLM(model=path, **args))
    assert preemptions > 0 and hits > 0  # the workload exercises what it claims
    llm = LLM(model=path, tensor_parallel_size=tensor_parallel_size, **args)
    try:
        split, split_preemptions, split_hits = _run(llm)
    finally:
        llm.shutdown()
    assert (split_preemptions, split_hits) == (preemptions, hits)  # one scheduler: the same steps
    _assert_same(whole, split)


def test_two_ranks_give_the_tokens_and_logprobs_of_one(architecture):
    _split_matches_whole(str(tiny_model_path(architecture)), 2)


@pytest.mark.parametrize("moe_architecture", TINY_MOE_ARCHITECTURES)
def test_mixture_of_experts_split_by_expert_intermediate_size_gives_the_tokens_and_logprobs_of_one(moe_architecture):
    """Each rank holds every expert's slice of the intermediate size (gpt-oss: stacked experts with
    biases, attention sinks split by head; Qwen2-MoE: a shared expert too)."""
    _split_matches_whole(str(tiny_model_path(moe_architecture)), 2)


def test_four_ranks_with_replicated_kv_heads_and_overlap_scheduling_give_the_tokens_and_logprobs_of_one():
    """Qwen3's tiny model has 2 KV heads: with 4 ranks each KV head lives on two of them. Overlap
    scheduling: decodes read the token still in flight on the device, which rank 0 broadcasts."""
    _split_matches_whole(str(tiny_model_path("Qwen3ForCausalLM")), 4, async_scheduling=True)


def test_a_dead_worker_fails_the_engine_with_its_rank_instead_of_hanging():
    llm = LLM(model=str(tiny_model_path("LlamaForCausalLM")), tensor_parallel_size=2, **ENGINE_ARGS)
    try:
        prompt = [{"prompt_token_ids": PROMPTS[0]}]
        params = SamplingParams(temperature=0.0, max_tokens=4)
        llm.generate(prompt, params, use_tqdm=False)
        worker = llm.llm_engine.executor.processes[1]
        os.kill(worker.pid, signal.SIGKILL)
        start = time.monotonic()
        for _ in range(2):  # the step that finds it dead, then every later one
            with pytest.raises(WorkerFailedError, match=r"rank 1 \(pid \d+\) was killed by signal SIGKILL"):
                llm.generate(prompt, params, use_tqdm=False)
        assert time.monotonic() - start < 10
        assert not llm.llm_engine.has_unfinished_requests()
    finally:
        llm.shutdown()


def test_ranks_started_by_torchrun_serve_rank_0s_engine():
    """distributed_launcher="torchrun": the same program on every rank (tp_torchrun_program.py)."""
    program = Path(__file__).with_name("tp_torchrun_program.py")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(program),
               str(tiny_model_path("Qwen2ForCausalLM"))]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("{")]  # rank 0's only
    result = json.loads(line)
    assert result["split"] == result["whole"]
