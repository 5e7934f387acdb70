"""Prefill and mixed steps served through piecewise graphs (worker/piecewise_graph.py) give the same
tokens and logprobs as eager steps. On CPU the padded static buffers run eagerly (capture=False),
attention between the pieces included; the GPU tests capture real graphs."""

import pytest
import torch

from tritonllm import LLM, SamplingParams, platform
from tritonllm.layers.attention import Attention
from tritonllm.worker import piecewise_graph
from tritonllm.worker.piecewise_graph import piecewise_sizes, weak_view

KW = dict(max_model_len=128, max_num_seqs=6, max_num_batched_tokens=24, async_scheduling=True)
FIRST_SIZE = 8  # padded sizes 8, 16, 24 at KW's token budget


def test_piecewise_sizes_pad_by_at_most_a_quarter_past_the_first_octaves() -> None:
    assert piecewise_sizes(8192) == [256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 5120,
                                     6144, 7168, 8192]  # fmt: skip
    assert piecewise_sizes(5000)[-2:] == [4096, 5000]
    assert piecewise_sizes(100) == [100]
    assert piecewise_sizes(24, first=8) == [8, 16, 24]
    assert len(piecewise_sizes(32768)) == 24
    sizes = piecewise_sizes(65536)
    assert all(b <= max(a * 1.25, 2048) for a, b in zip(sizes, sizes[1:]))


def test_weak_view_aliases_without_owning() -> None:
    t = torch.arange(24.0).view(4, 6)[:, 2:5]
    w = weak_view(t)
    assert (w.shape, w.stride(), w.data_ptr()) == (t.shape, t.stride(), t.data_ptr())
    t.mul_(2)
    assert torch.equal(w, t)
    assert t.untyped_storage()._cdata != w.untyped_storage()._cdata  # its own, non-owning storage


def _params(max_tokens: int, prompt_logprobs: int | None = None) -> SamplingParams:
    return SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=2, prompt_logprobs=prompt_logprobs
    )


def _prompts() -> tuple[list[list[int]], list[list[int]]]:
    """A first round of staggered prompts (chunked at 24 tokens, decodes beside chunks) and a second
    whose prompts share the first's full block (prefix-cache hits: those take no prompt logprobs)."""
    g = torch.Generator().manual_seed(5)
    first = [torch.randint(5, 600, (n,), generator=g).tolist() for n in (5, 29, 14)]
    second = [first[1][:16] + [7, 8, 9], first[1][:16] + torch.randint(5, 600, (11,), generator=g).tolist()]
    return first, second


def _run(llm: LLM) -> list:
    first, second = _prompts()
    outputs = []
    for prompts, params in ((first, _params(5, prompt_logprobs=1)), (second, _params(3))):
        outputs += llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.llm_engine.kv_cache.check_invariant()
    return outputs


def _compare(eager: list, piecewise: list, tol: float) -> None:
    for a, b in zip(eager, piecewise, strict=True):
        out_a, out_b = a.outputs[0], b.outputs[0]
        assert out_a.token_ids == out_b.token_ids
        for step, token in enumerate(out_a.token_ids):
            assert abs(out_a.logprobs[step][token].logprob - out_b.logprobs[step][token].logprob) < tol
        for pos in range(1, len(a.prompt_token_ids) if a.prompt_logprobs else 0):
            token = a.prompt_token_ids[pos]
            assert abs(a.prompt_logprobs[pos][token].logprob - b.prompt_logprobs[pos][token].logprob) < tol


def _piecewise_llm(model: str, rope_kv_write: bool = True) -> tuple[LLM, list[int]]:
    """An engine whose prefill, mixed and decode steps all take the padded piecewise path; returns
    it and the list that records each step's token count."""
    llm = LLM(model=model, **KW)
    runner = llm.llm_engine.runner
    runner.enable_piecewise_graphs(
        KW["max_num_batched_tokens"], capture=False, first_size=FIRST_SIZE, rope_kv_write=rope_kv_write
    )
    graphs = runner.piecewise_graphs
    # NaN in every row no attention wrote: a padding row leaking into a real one shows up in the logprobs
    graphs.attn_out.fill_(float("nan"))
    num_tokens: list[int] = []
    run = graphs.run
    graphs.run = lambda input_ids, *rest: (num_tokens.append(input_ids.shape[0]), run(input_ids, *rest))[1]
    return llm, num_tokens


@pytest.fixture(scope="module")
def eager_outputs(tiny_llama) -> list:
    return _run(LLM(model=tiny_llama, **KW))


@pytest.mark.parametrize("rope_kv_write", [True, False], ids=["rope_kv_write_in_pieces", "rope_kv_write_eager"])
def test_padded_piecewise_buffers_match_eager(tiny_llama, eager_outputs, rope_kv_write) -> None:
    llm, num_tokens = _piecewise_llm(tiny_llama, rope_kv_write)
    assert (llm.llm_engine.runner.piecewise_graphs.slot_mapping is not None) == rope_kv_write
    _compare(eager_outputs, _run(llm), 1e-4)
    sizes = llm.llm_engine.runner.piecewise_graphs.sizes
    assert {n for n in num_tokens if n not in sizes}  # steps padded to a larger size
    assert max(num_tokens) == sizes[-1] and min(num_tokens) < FIRST_SIZE
    assert llm.llm_engine.kv_cache.prefix_cache_hits >= 2 * 16


def test_skipping_attention_between_the_pieces_changes_the_tokens(tiny_llama, eager_outputs, monkeypatch) -> None:
    """The comparison above can fail: pieces whose attention never runs give other tokens."""
    monkeypatch.setattr(piecewise_graph._EagerSplit, "split", lambda self, *args: self.out)
    llm, _ = _piecewise_llm(tiny_llama)
    llm.llm_engine.runner.piecewise_graphs.attn_out.zero_()  # finite: the model runs without attention
    first, _ = _prompts()
    got = llm.generate([{"prompt_token_ids": first[1]}], _params(2), use_tqdm=False)
    assert got[0].outputs[0].token_ids != eager_outputs[1].outputs[0].token_ids[:2]


def test_a_shorter_step_resets_the_slots_a_longer_one_left() -> None:
    model = torch.nn.Module()
    model.attn = Attention(2, 1, 4, 0.5)
    graphs = piecewise_graph.PiecewiseGraphs(
        model, 24, torch.float32, torch.device("cpu"), first_size=8, rope_kv_write=True
    )
    assert graphs.slot_mapping.tolist() == [-1] * 24  # what the capture sees: no KV written
    graphs._stage_slots(torch.arange(100, 110))
    graphs._stage_slots(torch.tensor([7, 3, 5]))
    assert graphs.slot_mapping.tolist() == [7, 3, 5] + [-1] * 21
    graphs._stage_slots(torch.arange(4))
    assert graphs.slot_mapping[:8].tolist() == [0, 1, 2, 3] + [-1] * 4 and graphs.slots_used == 4


def test_stale_slots_in_the_padding_rows_change_the_tokens(tiny_llama, eager_outputs, monkeypatch) -> None:
    """The padding rows' RoPE + KV write goes nowhere only because their slots are -1: left at a longer
    step's slots, it overwrites that step's K/V and the tokens change."""

    def stage_without_reset(self, slot_mapping):
        self.slot_mapping[: slot_mapping.shape[0]].copy_(slot_mapping)
        return self.slot_mapping

    monkeypatch.setattr(piecewise_graph.PiecewiseGraphs, "_stage_slots", stage_without_reset)
    llm, _ = _piecewise_llm(tiny_llama)
    got = _run(llm)
    assert any(a.outputs[0].token_ids != b.outputs[0].token_ids for a, b in zip(eager_outputs, got))


@pytest.mark.gpu
@pytest.mark.skipif(not platform.is_gpu(), reason="CUDA graphs need a GPU")
def test_gpu_captured_piecewise_graphs_match_eager(tiny_model) -> None:
    # float32: piecewise and eager steps differ only in the GEMMs' padded row counts, so tokens agree
    # exactly; decode graphs serve the pure-decode steps of the graphed engine
    kw = dict(model=tiny_model, dtype="float32", **KW)
    eager = _run(LLM(**kw, enforce_eager=True))
    llm = LLM(**kw)  # the engine's own capture: one size (24, below the first size 256)
    graphs = llm.llm_engine.runner.piecewise_graphs
    assert graphs is not None and list(graphs.buckets) == [24]
    assert len(graphs.buckets[24].graphs) == llm.llm_engine.model.num_layers + 1
    _compare(eager, _run(llm), 1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not platform.is_gpu(), reason="CUDA graphs need a GPU")
def test_gpu_piecewise_graphs_of_several_sizes_match_eager(tiny_model) -> None:
    """Sizes 24, 16, 8 captured largest first into one pool, after the engine's start-up."""
    kw = dict(model=tiny_model, dtype="float32", **KW)
    eager = _run(LLM(**kw, enforce_eager=True))
    llm = LLM(**kw, piecewise_graphs=False)
    runner = llm.llm_engine.runner
    assert runner.piecewise_graphs is None and runner.decode_graphs is not None
    # the RoPE + KV write inside the pieces (opt-in; the engine's default capture above runs it eagerly)
    runner.enable_piecewise_graphs(KW["max_num_batched_tokens"], first_size=FIRST_SIZE, rope_kv_write=True)
    assert sorted(runner.piecewise_graphs.buckets) == [8, 16, 24]
    _compare(eager, _run(llm), 1e-3)
