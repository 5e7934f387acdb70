"""Continuous batching, chunked prefill, preemption, policies, abort and metrics (CPU, tiny Llama)."""

import random

import pytest

from tritonllm import LLM, SamplingParams
from tritonllm.entrypoints.llm import PromptRejectedError


def make_llm(path: str, max_model_len: int = 128, **kwargs) -> LLM:
    # the torch reference kernels: the scheduler is under test, not the kernels (the Triton ones run the
    # same batches in test_engine_vs_hf.py and test_prefix_caching.py); the interpreter made this file
    # take ~6 of the CPU suite's 19 minutes
    kwargs.setdefault("kernel_backend", "torch_ref")
    return LLM(model=path, max_model_len=max_model_len, **kwargs)


def random_workload(n: int, seed: int = 0) -> tuple[list[dict], list[SamplingParams]]:
    rng = random.Random(seed)
    prompts = [{"prompt_token_ids": [rng.randrange(5, 600) for _ in range(rng.randint(2, 40))]} for _ in range(n)]
    params = []
    for i in range(n):
        if i % 2:
            params.append(SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 16), ignore_eos=True))
        else:
            params.append(
                SamplingParams(temperature=0.9, top_k=40, seed=i, max_tokens=rng.randint(1, 16), ignore_eos=True)
            )
    return prompts, params


def run_checked(llm: LLM, prompts: list[dict], params: list[SamplingParams]) -> list[list[int]]:
    """Drive the engine step by step, checking the block invariant after every step."""
    engine = llm.llm_engine
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(f"r{i}", prompt["prompt_token_ids"], p)
    results: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out.outputs[0].token_ids
        kv = engine.kv_cache
        kv.check_invariant()
        assert kv.num_used_blocks + kv.num_free_blocks == kv.num_blocks  # free counts cached-evictable
    return [results[f"r{i}"] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def reference_outputs(tiny_llama):
    prompts, params = random_workload(50)
    llm = make_llm(tiny_llama, max_num_batched_tokens=4096)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_preempted_requests_finish_with_the_same_tokens(tiny_llama, reference_outputs):
    prompts, params = random_workload(50)
    llm = make_llm(tiny_llama, max_model_len=64, num_gpu_blocks_override=12, block_size=8, max_num_batched_tokens=64)
    outputs = run_checked(llm, prompts, params)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert outputs == reference_outputs
    metrics = {m.name: m.value for m in llm.get_metrics()}
    assert metrics["tritonllm:num_preemptions"] == llm.llm_engine.scheduler.num_preemptions
    assert llm.llm_engine.kv_cache.num_free_blocks == 12


@pytest.mark.parametrize("budget", [7, 33])
def test_chunked_prefill_gives_identical_outputs(tiny_llama, budget):
    prompts, params = random_workload(6, seed=1)
    whole = make_llm(tiny_llama, enable_chunked_prefill=False).generate(prompts, params, use_tqdm=False)
    llm = make_llm(tiny_llama, max_num_batched_tokens=budget)
    chunked = run_checked(llm, prompts, params)
    assert chunked == [o.outputs[0].token_ids for o in whole]
    steps = llm.llm_engine.stats.steps
    assert max(s.num_scheduled_tokens for s in steps) <= budget


def test_chunked_prefill_mixes_decodes_and_chunks_in_one_step(tiny_llama):
    llm = make_llm(tiny_llama, max_num_batched_tokens=16)
    engine = llm.llm_engine
    engine.add_request("short", [5, 6, 7], SamplingParams(max_tokens=10, ignore_eos=True))
    engine.step()  # prefill of the short prompt
    engine.add_request("long", list(range(10, 60)), SamplingParams(max_tokens=2, ignore_eos=True))
    sched = engine.scheduler.schedule()
    sizes = {s.request.request_id: s.num_new_tokens for s in sched.scheduled}
    assert sizes == {"short": 1, "long": 15}
    engine.runner.execute(sched).result()


def test_a_new_prompt_yields_tokens_so_its_step_ends_on_a_padded_size(tiny_llama):
    """Padded sizes 8, 16, ..., 64: three decodes + a prompt with 14 tokens past its cached prefix (17 tokens)
    would run at 24, so the prompt takes 13 (16 tokens) and its last token joins the next step; a step just
    short of a size, or one that would have to give up more than the padding it saves, is left alone. Tokens
    as without, the KV blocks' invariant kept."""
    earlier = list(range(300, 340))  # its first two blocks of 16 are the prompt's cached prefix
    prompt = earlier[:32] + list(range(100, 114))
    greedy = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    tokens, counts = {}, {}
    for align in (True, False):
        llm = make_llm(tiny_llama, max_num_batched_tokens=64, piecewise_first_size=8, align_prefill_chunks=align)
        engine = llm.llm_engine
        assert engine.scheduler.step_sizes == ([8, 16, 24, 32, 40, 48, 56, 64] if align else [])
        engine.add_request("earlier", earlier, SamplingParams(max_tokens=1))
        while engine.has_unfinished_requests():
            engine.step()
        for i in range(3):
            engine.add_request(f"d{i}", [5 + i, 6, 7, 8], greedy)
        engine.step()  # 12 tokens: 4 over 8 and 4 short of 16, so nothing yields
        engine.add_request("p", prompt, greedy)
        out, steps = {}, []
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    out[o.request_id] = o.outputs[0].token_ids
            steps.append(engine.stats.steps[-1].num_scheduled_tokens)
            engine.kv_cache.check_invariant()
        assert {m.name: m.value for m in llm.get_metrics()}["tritonllm:prefix_cache_hits"] == 32
        tokens[align], counts[align] = out, steps
    assert counts[False][0] == 17
    assert counts[True][:2] == [16, 4]  # three decodes + 13 of the prompt, then three decodes + its last
    assert tokens[True] == tokens[False]
    sched = make_llm(tiny_llama, max_num_batched_tokens=64, piecewise_first_size=8).llm_engine.scheduler
    assert sched._aligned(3, 14) == 13  # 17 -> 16
    assert sched._aligned(3, 12) == 12  # 15: short of 16, runs padded by one
    assert sched._aligned(3, 18) == 18  # 21: 5 over 16, 3 short of 24
    assert sched._aligned(10, 7) == 6  # 17 -> 16, whatever came before it in the step
    assert sched._aligned(16, 1) == 1  # 17: yielding would leave the prompt nothing this step


def test_prompt_logprobs_survive_chunking(tiny_llama):
    prompt = {"prompt_token_ids": list(range(20, 61))}
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=2)
    whole = make_llm(tiny_llama).generate([prompt], params, use_tqdm=False)[0]
    chunked = make_llm(tiny_llama, max_num_batched_tokens=7).generate([prompt], params, use_tqdm=False)[0]
    assert len(chunked.prompt_logprobs) == len(prompt["prompt_token_ids"])
    for a, b in zip(whole.prompt_logprobs[1:], chunked.prompt_logprobs[1:]):
        assert a.keys() == b.keys()
        assert all(abs(a[t].logprob - b[t].logprob) < 1e-4 for t in a)


def test_abort_frees_blocks_at_once(tiny_llama):
    llm = make_llm(tiny_llama)
    engine = llm.llm_engine
    engine.add_request("a", list(range(5, 40)), SamplingParams(max_tokens=50, ignore_eos=True))
    engine.add_request("b", list(range(5, 20)), SamplingParams(max_tokens=5, ignore_eos=True))
    engine.step()
    engine.step()
    held = len(engine.kv_cache.block_ids("a"))
    assert held > 0
    free_before = engine.kv_cache.num_free_blocks
    engine.abort_request("a")
    assert engine.kv_cache.num_free_blocks == free_before + held
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert set(finished) == {"b"} and len(finished["b"].outputs[0].token_ids) == 5
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks


def test_too_long_prompt_is_rejected_while_the_others_finish(tiny_llama):
    llm = make_llm(tiny_llama)
    prompts = ["a short one", {"prompt_token_ids": [5] * 500}, "another short one"]
    with pytest.raises(PromptRejectedError, match="max_model_len") as err:
        llm.generate(prompts, SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    outputs = err.value.outputs
    assert outputs[1] is None and set(err.value.errors) == {1}
    assert all(len(outputs[i].outputs[0].token_ids) == 3 for i in (0, 2))
    assert llm.llm_engine.kv_cache.num_free_blocks == llm.llm_engine.kv_cache.num_blocks


def test_priority_policy_runs_urgent_requests_first(tiny_llama):
    llm = make_llm(tiny_llama, scheduling_policy="priority", max_num_seqs=1)
    prompts = ["first come", "urgent", "last"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True), priority=[5, 0, 9], use_tqdm=False)
    order = sorted(range(3), key=lambda i: outs[i].metrics.first_scheduled_time)
    assert order == [1, 0, 2]


def test_fcfs_admits_in_arrival_order(tiny_llama):
    llm = make_llm(tiny_llama, max_num_seqs=1)
    outs = llm.generate(["one", "two", "three"], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    times = [o.metrics.first_scheduled_time for o in outs]
    assert times == sorted(times)


def test_metrics_report_requests_tokens_and_kv_usage(tiny_llama):
    llm = make_llm(tiny_llama)
    outs = llm.generate(["alpha", "beta gamma"], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    metrics = {m.name: m for m in llm.get_metrics()}
    for name in (
        "tritonllm:num_requests_running",
        "tritonllm:num_requests_waiting",
        "tritonllm:kv_cache_usage_perc",
        "tritonllm:num_preemptions",
        "tritonllm:prompt_tokens",
        "tritonllm:generation_tokens",
    ):
        assert name in metrics
    assert metrics["tritonllm:generation_tokens"].value == 8
    assert metrics["tritonllm:prompt_tokens"].value == sum(len(o.prompt_token_ids) for o in outs)
    assert metrics["tritonllm:num_requests_running"].value == 0
    assert metrics["tritonllm:time_to_first_token_seconds"].count == 2
    for o in outs:
        m = o.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time


def test_max_model_len_beyond_the_kv_cache_is_refused_naming_both(tiny_llama):
    with pytest.raises(ValueError, match=r"max_model_len 128 exceeds the KV cache \(64 tokens\)"):
        make_llm(tiny_llama, num_gpu_blocks_override=4, block_size=16)


def test_generate_shows_progress_bar(tiny_llama, capsys):
    make_llm(tiny_llama).generate(["x"], SamplingParams(max_tokens=2), use_tqdm=True)
    assert "Processed prompts" in capsys.readouterr().err
