"""Decode steps served from the static padded buffers of worker/cuda_graph.py give the same
tokens and logprobs as eager steps. On CPU the buffers run eagerly (capture=False); the GPU test
captures real graphs."""

import numpy as np
import pytest
import torch

from tritonllm import LLM, SamplingParams, platform
from tritonllm.worker.cuda_graph import capture_sizes, graph_entries

NUM_STEPS = 8


def test_capture_sizes_cover_every_batch() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(40) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert capture_sizes(44)[-2:] == [40, 44]


def test_a_graph_applies_its_entries_only_one_a_row_and_within_its_size() -> None:
    """kernels/step_inputs.py patches one entry a row: more for a row, or more than the graph's rows, are
    applied before the graph."""
    one_each = (np.array([3, 0, 5]), np.array([2, 7, 1]), np.array([11, 12, 13], dtype=np.int32))
    assert graph_entries(one_each, 4) is one_each
    assert graph_entries(one_each, 2) is None
    assert graph_entries(None, 4) is None
    two_for_row_3 = (np.array([3, 3]), np.array([2, 3]), np.array([11, 12], dtype=np.int32))
    assert graph_entries(two_for_row_3, 8) is None


def _generate(llm: LLM, prompts: list[list[int]]) -> list:
    params = SamplingParams(temperature=0.0, max_tokens=NUM_STEPS, ignore_eos=True, logprobs=2)
    # staggered lengths: prompts finish prefill at different steps, so decode batches of 1-3 rows
    # (padded to 1, 2 and 4) run next to prefill steps that stay eager
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def _compare(eager: list, graphed: list, tol: float) -> None:
    for a, b in zip(eager, graphed, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for step, token in enumerate(a.outputs[0].token_ids):
            assert abs(a.outputs[0].logprobs[step][token].logprob - b.outputs[0].logprobs[step][token].logprob) < tol


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(5, 600, (n,), generator=g).tolist() for n in (5, 33, 18)]


def test_padded_decode_buffers_match_eager(tiny_llama, prompts) -> None:
    kw = dict(model=tiny_llama, max_model_len=128, max_num_seqs=6, max_num_batched_tokens=20)
    eager = _generate(LLM(**kw), prompts)
    llm = LLM(**kw)
    engine = llm.llm_engine
    engine.runner.enable_decode_graphs(6, engine.max_model_len, capture=False)
    graphed = _generate(llm, prompts)
    _compare(eager, graphed, 1e-4)
    engine.kv_cache.check_invariant()


@pytest.mark.gpu
@pytest.mark.skipif(not platform.is_gpu(), reason="CUDA graphs need a GPU")
def test_gpu_captured_decode_graphs_match_eager(tiny_model, prompts) -> None:
    # float32: graph and eager steps differ only in the split count of attention (sized for
    # max_model_len at capture), so tokens must agree exactly
    kw = dict(model=tiny_model, dtype="float32", max_model_len=256, max_num_seqs=12)
    eager = _generate(LLM(**kw, enforce_eager=True), prompts)
    llm = LLM(**kw, enforce_eager=False)
    assert llm.llm_engine.runner.decode_graphs is not None
    assert llm.llm_engine.runner.decode_graphs.graphs
    _compare(eager, _generate(llm, prompts), 1e-3)


def test_warm_up_compiles_prefill_shapes_without_touching_the_cache(tiny_llama) -> None:
    llm = LLM(model=tiny_llama, max_model_len=64)
    runner = llm.llm_engine.runner
    k_cache, v_cache = runner.kv_caches[0]
    k_cache.normal_()
    before = k_cache.clone()
    runner.warm_up()
    assert torch.equal(k_cache, before)  # cache slot -1: nothing written
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    fresh = LLM(model=tiny_llama, max_model_len=64).generate(["The river"], params, use_tqdm=False)
    assert llm.generate(["The river"], params, use_tqdm=False)[0].outputs[0].token_ids == fresh[0].outputs[0].token_ids
