"""Overlap scheduling (async_scheduling): step N+1 is scheduled and launched before step N's
tokens are read, and the results stay exactly those of the synchronous loop — tokens, logprobs,
texts, finish reasons — through stops, max_tokens, preemption, chunked prefill and aborts. Also
the persistent batch's block table and the prefix cache's rule that blocks are shared only once
written (CPU, tiny Llama)."""

import random

import pytest
import torch

from tritonllm import LLM, SamplingParams, platform
from tritonllm.worker.input_batch import step_seed, step_seeds

KW = dict(max_model_len=96)
# the comparisons are of the two scheduling loops, whatever the kernels: the torch reference kernels
# (the interpreter took ~38 s a case)
REF = dict(kernel_backend="torch_ref")


def workload(seed: int = 0) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(5, 600) for _ in range(rng.randint(3, 30))] for _ in range(10)]
    params = []
    for i in range(len(prompts)):
        kind = i % 5
        if kind == 0:
            params.append(SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 10), ignore_eos=True, logprobs=2))
        elif kind == 1:
            params.append(SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=i, max_tokens=10, stop=["e", " t"]))
        elif kind == 2:  # EOS ends it (the tiny model's EOS is a common token under min_tokens bans)
            params.append(SamplingParams(temperature=1.0, seed=i, max_tokens=12, min_tokens=2, stop_token_ids=[7, 9]))
        elif kind == 3:
            params.append(
                SamplingParams(n=2, temperature=0.8, seed=i, max_tokens=8, ignore_eos=True, stop=[" the", "e"])
            )
        else:
            params.append(SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, prompt_logprobs=1))
    return prompts, params


def sample_counts(llm: LLM) -> dict[str, int]:
    """Wrap the runner so that the tokens sampled for each request are counted."""
    counts: dict[str, int] = {}
    runner = llm.llm_engine.runner
    execute = runner.execute

    def counting(sched):
        for s in sched.scheduled:
            counts[s.request.request_id] = counts.get(s.request.request_id, 0) + s.samples
        return execute(sched)

    runner.execute = counting
    return counts


def run_checked(llm: LLM, prompts, params) -> dict[str, object]:
    """Drive the engine step by step with the block invariant and the persistent batch's block
    tables checked after every step; returns the final output of each request."""
    engine = llm.llm_engine
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), p, sp)
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id not in finished, "a finished request was emitted again"
            if out.finished:
                finished[out.request_id] = out
        engine.kv_cache.check_invariant()
        batch = engine.runner.batch
        for request in engine.scheduler.running:
            row = batch.row_of.get(request.request_id)
            if row is not None:
                blocks = engine.kv_cache.block_ids(request.request_id)
                assert batch.table_np[row, : len(blocks)].tolist() == blocks
                assert batch.block_table[row, : len(blocks)].tolist() == blocks
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks
    return finished


def summary(out) -> list[tuple]:
    """What must match exactly: tokens, texts, finish and stop reasons, logprob entries' tokens,
    ranks and strings (their values are compared with a tolerance: batches differ in composition)."""
    return [
        (c.token_ids, c.text, c.finish_reason, c.stop_reason,
         [sorted((t, lp.rank, lp.decoded_token) for t, lp in e.items()) for e in c.logprobs or []])
        for c in out.outputs
    ]  # fmt: skip


def logprob_values(out) -> list[float]:
    values = [lp.logprob for c in out.outputs for e in c.logprobs or [] for lp in e.values()]
    values += [c.cumulative_logprob for c in out.outputs if c.cumulative_logprob is not None]
    return values + [lp.logprob for e in out.prompt_logprobs or [] if e for lp in e.values()]


@pytest.mark.parametrize(
    "engine_kwargs",
    [{"max_num_batched_tokens": 24}, {"num_gpu_blocks_override": 12, "block_size": 8, "max_num_batched_tokens": 32}],
    ids=["chunked", "preempting"],
)
def test_overlap_gives_the_outputs_of_the_synchronous_loop(tiny_llama, engine_kwargs):
    prompts, params = workload()
    sync = LLM(model=tiny_llama, **KW, **REF, **engine_kwargs, async_scheduling=False)
    overlap = LLM(model=tiny_llama, **KW, **REF, **engine_kwargs, async_scheduling=True)
    sync_counts, overlap_counts = sample_counts(sync), sample_counts(overlap)
    expected, got = run_checked(sync, prompts, params), run_checked(overlap, prompts, params)
    assert expected.keys() == got.keys() == {str(i) for i in range(len(prompts))}
    for key in expected:
        assert summary(got[key]) == summary(expected[key]), key
        assert [e and sorted(e) for e in got[key].prompt_logprobs or []] == [
            e and sorted(e) for e in expected[key].prompt_logprobs or []
        ]
        assert logprob_values(got[key]) == pytest.approx(logprob_values(expected[key]), abs=1e-4)
    if "num_gpu_blocks_override" in engine_kwargs:
        assert overlap.llm_engine.scheduler.num_preemptions > 0
    # With overlap, a request stopped by a token or a stop string sampled one token more (in flight
    # when it stopped, dropped), one that ran to max_tokens did not: the discard path ran, and
    # max_tokens is exact.
    stopped = [k for k, o in expected.items() if o.outputs[0].stop_reason is not None and params[int(k)].n == 1]
    lengthy = [k for k, o in expected.items() if o.outputs[0].finish_reason == "length" and params[int(k)].n == 1]
    assert stopped and lengthy
    for k in stopped + lengthy:
        num_tokens = len(expected[k].outputs[0].token_ids)
        assert sync_counts[k] == num_tokens
        assert overlap_counts[k] == num_tokens + (k in stopped), k


def test_overlap_outputs_arrive_one_step_late(tiny_llama):
    llm = LLM(model=tiny_llama, **KW, async_scheduling=True)
    engine = llm.llm_engine
    engine.add_request("a", [5, 6, 7, 8], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert engine.step() == []  # prefill launched; nothing processed yet
    first = engine.step()  # the decode launched on the token in flight; the prefill's token read
    assert [len(o.outputs[0].token_ids) for o in first] == [1]
    assert engine.scheduler.running and next(iter(engine.scheduler.running)).num_output_placeholders == 1


def test_abort_while_a_step_is_in_flight_emits_nothing_more(tiny_llama):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    reference = LLM(model=tiny_llama, **KW).generate([{"prompt_token_ids": [9, 8, 7, 6]}], params, use_tqdm=False)
    llm = LLM(model=tiny_llama, **KW, async_scheduling=True)
    engine = llm.llm_engine
    engine.add_request("keep", [9, 8, 7, 6], params)
    engine.add_request("drop", list(range(20, 50)), params)
    for _ in range(4):
        engine.step()
    engine.abort_request("drop")  # its next token is in flight
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert {o.request_id for o in outputs} == {"keep"}
    assert outputs[-1].outputs[0].token_ids == reference[0].outputs[0].token_ids
    engine.kv_cache.check_invariant()
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks


@pytest.mark.parametrize(
    "async_scheduling, good_steps", [(False, 0), (True, 0), (True, 1)], ids=["sync", "overlap", "overlap-in-flight"]
)
def test_a_failed_step_publishes_no_unwritten_blocks(tiny_llama, async_scheduling, good_steps):
    """A runner that raises after scheduling (with overlap, also while the step before is in
    flight): the requests are aborted, their blocks freed, and a later request with the same prefix
    computes it instead of reading KV that was never written."""
    prompt = list(range(100, 150))  # three full 16-token blocks
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    expected = LLM(model=tiny_llama, **KW).generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    llm = LLM(model=tiny_llama, **KW, async_scheduling=async_scheduling)
    engine = llm.llm_engine
    execute = engine.runner.execute

    calls = []

    def failing(sched):
        calls.append(sched)
        if len(calls) > good_steps:
            raise RuntimeError("device lost")
        return execute(sched)

    engine.runner.execute = failing
    engine.add_request("doomed", prompt, params)
    with pytest.raises(RuntimeError, match="device lost"):
        for _ in range(good_steps + 1):
            engine.step()
    assert not engine.has_unfinished_requests()
    engine.kv_cache.check_invariant()
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks
    engine.runner.execute = execute
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)  # the engine keeps serving
    assert out[0].outputs[0].token_ids == expected[0].outputs[0].token_ids
    metrics = {m.name: m.value for m in llm.get_metrics()}
    assert metrics["tritonllm:prefix_cache_hits"] == 0


def test_blocks_published_by_an_admission_are_shared_within_the_step(tiny_llama):
    llm = LLM(model=tiny_llama, **KW)
    prompt = list(range(100, 150))
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompt + [i]} for i in range(3)], params, use_tqdm=False)
    metrics = {m.name: m.value for m in llm.get_metrics()}
    assert metrics["tritonllm:prefix_cache_hits"] == 2 * 48  # the 2nd and 3rd share the 1st's blocks


def test_device_seeds_match_the_host_formula():
    g = torch.Generator().manual_seed(0)
    bases = torch.randint(0, 2**62, (64,), generator=g, dtype=torch.int64)
    steps = torch.randint(0, 5000, (64,), generator=g, dtype=torch.int64)
    assert step_seeds(bases, steps).tolist() == [step_seed(b, s) for b, s in zip(bases.tolist(), steps.tolist())]


@pytest.mark.gpu
@pytest.mark.skipif(not platform.is_gpu(), reason="CUDA graphs and streams need a GPU")
def test_gpu_overlap_with_captured_graphs_gives_the_synchronous_outputs(tiny_model):
    """On the GPU: pinned staging, events, the device-side token hand-off and decode graphs that
    sample, against the synchronous loop with the same graphs (float32)."""
    prompts, params = workload()
    kw = dict(model=tiny_model, dtype="float32", **KW, max_num_batched_tokens=24)
    expected = run_checked(LLM(**kw, async_scheduling=False), prompts, params)
    overlap = LLM(**kw, async_scheduling=True)
    assert overlap.llm_engine.runner.decode_graphs.graphs
    got = run_checked(overlap, prompts, params)
    for key in expected:
        assert summary(got[key]) == summary(expected[key]), key
        assert logprob_values(got[key]) == pytest.approx(logprob_values(expected[key]), abs=1e-3)


def test_a_dropped_engine_is_freed_without_the_cycle_collector(tiny_llama):
    """The engine, its runner and its graphs hold no reference cycle, so dropping an `LLM` frees
    its KV cache at once and the next engine's memory profile does not count it."""
    import gc
    import weakref

    llm = LLM(model=tiny_llama, **KW, async_scheduling=True)
    llm.llm_engine.runner.enable_decode_graphs(4, 96, capture=False)
    llm.generate(["The baker"], SamplingParams(max_tokens=3), use_tqdm=False)
    engine, runner = weakref.ref(llm.llm_engine), weakref.ref(llm.llm_engine.runner)
    gc.disable()
    try:
        del llm
        assert engine() is None and runner() is None
    finally:
        gc.enable()


def test_rows_of_requests_that_finish_before_an_empty_step_are_freed(tiny_llama):
    """With overlap, a request can finish while the only other one has its last token in flight:
    the next schedule is empty and does not run, and the finished request's batch row must still
    be freed (by the next step that runs). A leak fills the batch: max_num_seqs=2 fails at once."""
    llm = LLM(model=tiny_llama, **KW, async_scheduling=True, max_num_seqs=2)
    params = [SamplingParams(max_tokens=2, ignore_eos=True), SamplingParams(max_tokens=3, ignore_eos=True)]
    for _ in range(3):
        outs = llm.generate(["a b", "c d"], params, use_tqdm=False)
        assert [len(o.outputs[0].token_ids) for o in outs] == [2, 3]
        assert len(llm.llm_engine.runner.batch) <= 2
