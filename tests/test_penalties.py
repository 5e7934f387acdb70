"""Presence, frequency and repetition penalties and logit_bias (OpenAI's and vLLM's definitions) against
HF transformers generating with the same adjustments as a logits processor: greedy tokens equal, with
overlap scheduling (the token in flight counts) and without, requests of different settings batched."""

from __future__ import annotations

import pytest
import torch
from engine_checks import assert_serves_on_with_every_block_free  # tests/
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from tritonllm import LLM, SamplingParams
from tritonllm.worker.model_runner import ModelRunner

# the first two start with tokens the tiny model's greedy continuation would pick (a repetition penalty bites)
PROMPTS = [
    [624, 441, 439, 385, 276, 5, 17, 42, 99, 7, 7, 12, 42, 5],
    [423, 295, 618, 97, 373, 300, 301, 7, 8, 9],
    [21, 21, 393, 444, 190, 212, 21],
]
STEPS = 12
# each bites on the tiny model: its greedy tokens differ from those without it (checked below)
SETTINGS = [
    dict(logit_bias={300: 8.0}, frequency_penalty=1.0),  # 300 repeats until its count outweighs the bias
    dict(repetition_penalty=2.0),
    dict(logit_bias={300: 6.0, 301: 5.0}, presence_penalty=2.0, frequency_penalty=-0.5),
    dict(logit_bias={21: -100.0, 393: 3.0}, repetition_penalty=0.7),
    dict(allowed_token_ids=[7, 42, 99, 300, 624, 385], frequency_penalty=1.0),  # vLLM's allowed_token_ids too
]


class OpenAIAdjustments(LogitsProcessor):
    """logit_bias, then vLLM's repetition penalty over prompt and output, then OpenAI's frequency and
    presence penalties over the output, then allowed_token_ids: the order the engine applies them in."""

    def __init__(self, prompt_len: int, params: dict) -> None:
        self.prompt_len, self.p = prompt_len, params

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.clone()
        for token, bias in self.p.get("logit_bias", {}).items():
            scores[:, token] += bias
        rep = self.p.get("repetition_penalty", 1.0)
        for row, ids in enumerate(input_ids):
            seen = torch.zeros(scores.shape[-1], dtype=torch.bool)
            seen[ids] = True
            x = scores[row]
            scores[row] = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
            counts = torch.bincount(ids[self.prompt_len :], minlength=scores.shape[-1]).float()
            scores[row] -= self.p.get("frequency_penalty", 0.0) * counts
            scores[row] -= self.p.get("presence_penalty", 0.0) * (counts > 0).float()
        if "allowed_token_ids" in self.p:
            allowed = torch.zeros(scores.shape[-1], dtype=torch.bool)
            allowed[self.p["allowed_token_ids"]] = True
            scores[:, ~allowed] = float("-inf")
        return scores


def hf_greedy(model, prompt: list[int], params: dict) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False,
        logits_processor=LogitsProcessorList([OpenAIAdjustments(len(prompt), params)]), pad_token_id=0,
    )  # fmt: skip
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def hf(tiny_llama):
    return AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32, attn_implementation="eager")


def generate(llm: LLM, settings: list[dict], logprobs: int | None = None) -> list[list[int]]:
    """Every prompt with every setting, in one batch."""
    prompts = [{"prompt_token_ids": p} for p in PROMPTS for _ in settings]
    params = [SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=logprobs, **s)
              for _ in PROMPTS for s in settings]  # fmt: skip
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.outputs[0] for o in outs]


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_penalties_and_logit_bias_match_hf(tiny_llama, hf, async_scheduling):
    llm = LLM(model=tiny_llama, max_model_len=128, seed=0, async_scheduling=async_scheduling)
    outs = generate(llm, [*SETTINGS, {}], logprobs=1)
    width = len(SETTINGS) + 1
    for p, prompt in enumerate(PROMPTS):
        plain = outs[p * width + len(SETTINGS)].token_ids
        assert plain == hf_greedy(hf, prompt, {})
        with torch.no_grad():
            raw = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1], -1)
        for s, setting in enumerate(SETTINGS):
            out = outs[p * width + s]
            assert out.token_ids == hf_greedy(hf, prompt, setting), (prompt, setting)
            # logprobs stay the model's own, before bias and penalties (vLLM's)
            first = out.token_ids[0]
            assert out.logprobs[0][first].logprob == pytest.approx(raw[first].item(), abs=2e-4)
    for s in range(len(SETTINGS)):  # every setting changes some prompt's greedy tokens
        assert any(outs[p * width + s].token_ids != outs[p * width + len(SETTINGS)].token_ids
                   for p in range(len(PROMPTS))), SETTINGS[s]  # fmt: skip


def test_a_token_in_flight_left_uncounted_is_caught(tiny_llama, hf, monkeypatch):
    """Under overlap scheduling each step's input token is still on the device when the step samples;
    counting only the tokens the host knows gives the frequency penalty one occurrence too few."""
    monkeypatch.setattr(ModelRunner, "_in_flight_tokens", lambda self, in_flight, copy_back: None)
    llm = LLM(model=tiny_llama, max_model_len=128, seed=0, async_scheduling=True)
    outs = generate(llm, SETTINGS[:1])
    assert any(o.token_ids != hf_greedy(hf, prompt, SETTINGS[0]) for o, prompt in zip(outs, PROMPTS))


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": float("nan")}, "repetition_penalty"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias keys"),
        ({"logit_bias": {5: 101.0}}, "logit_bias values"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"allowed_token_ids": [3, -1]}, "allowed_token_ids"),
    ],
)
def test_bad_penalties_raise_value_error_naming_the_parameter(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


def test_logit_bias_past_the_vocabulary_is_refused_and_the_engine_keeps_serving(tiny_llama):
    llm = LLM(model=tiny_llama, max_model_len=128, seed=0)
    with pytest.raises(ValueError, match=r"logit_bias names token 640: token ids must lie in \[0, 640\)"):
        llm.generate([{"prompt_token_ids": [5, 6]}], SamplingParams(logit_bias={640: 1.0}), use_tqdm=False)
    assert_serves_on_with_every_block_free(llm)


@pytest.mark.gpu
def test_penalties_in_decode_graphs_with_overlap_equal_eager_synchronous_steps(tiny_llama):
    """On the GPU a decode step replays a graph, then samples the special rows again from its logits,
    with each row's token in flight gathered before the graph overwrites it: the same tokens as eager,
    synchronous steps (where every token is known on the host) of the same kernels."""
    kw = dict(model=tiny_llama, dtype="bfloat16", max_model_len=128, seed=0, num_gpu_blocks_override=256)  # two engines
    graphs = LLM(**kw, async_scheduling=True)
    assert graphs.llm_engine.runner.decode_graphs is not None
    eager = LLM(**kw, async_scheduling=False, enforce_eager=True)
    got, expected = generate(graphs, [*SETTINGS, {}]), generate(eager, [*SETTINGS, {}])
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]


def test_token_arrays_follow_the_growing_output_list():
    """The penalties' per-request arrays (worker/logit_adjust.TokenArrays): the prompt once, the generated tokens
    appended step by step across the buffer's growth, the same values as the lists."""
    from tritonllm.worker.logit_adjust import TokenArrays

    arrays = TokenArrays([5, 6, 7])
    out: list[int] = []
    for step in range(300):
        out += [step % 17] * (1 + step % 3)  # one to three tokens a step
        assert arrays.output(out).tolist() == out
    assert arrays.prompt.tolist() == [5, 6, 7] and arrays.output(out) is not None
