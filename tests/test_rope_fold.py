"""fold_rope_into_attention (opt-in until timed on a GPU): at split-KV decode steps the attention kernel rotates q (after Qwen3's
per-head norm) and writes the step's K/V itself, and no rope_kv_write kernel runs; with it off, that kernel runs
first. The same values either way, so greedy tokens and their logprobs agree to the bit on the CPU. The CPU has
one "multiprocessor", which never splits, so the tests give the attention config 64 and short split segments (on a
GPU, batch-1 decode graphs split already: they are captured at max_model_len)."""

from __future__ import annotations

import dataclasses

import pytest

from tritonllm import LLM, SamplingParams, platform
from tritonllm.kernels import attention
from tritonllm.models.tiny import tiny_model_path

PROMPTS = [{"prompt_token_ids": list(range(10 + i, 40 + 3 * i))} for i in range(2)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)


@pytest.fixture
def split_decode(monkeypatch):
    """Decode steps take split-KV attention on the CPU (a 64-SM wave, segments of 8 keys and up)."""
    monkeypatch.setattr(attention, "_num_multiprocessors", lambda: 64)
    config = attention.ATTENTION_CONFIGS["interpreter"]
    monkeypatch.setitem(attention.ATTENTION_CONFIGS, "interpreter", dataclasses.replace(config, split_min_keys=8))


def _generate(model: str, fold: bool, monkeypatch) -> tuple[list, list, int]:
    """(token ids, logprobs of each sampled token, the rope_kv_write launches of the decode steps) of one engine."""
    llm = LLM(model=model, max_model_len=128, fold_rope_into_attention=fold)
    kernels = llm.llm_engine.runner.kernels
    launches, folded = [], []
    rope_kv_write, run = kernels.rotary_write_kv_cache, attention.AttentionPlan.run

    def spy(positions, *args, **kwargs):
        launches.append(positions.shape[0])
        return rope_kv_write(positions, *args, **kwargs)

    def run_spy(self, *args, **kwargs):
        folded.append(kwargs.get("rope") is not None)
        return run(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(kernels, "rotary_write_kv_cache", spy)
        m.setattr(attention.AttentionPlan, "run", run_spy)
        outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in outputs]
    logprobs = [[lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)] for o in outputs]
    assert any(folded) == fold
    return tokens, logprobs, sum(n <= len(PROMPTS) for n in launches)


# Llama (NeoX rotation), Qwen3 (per-head q / k norms first), gpt-oss (sinks, a sliding window every other layer,
# YaRN's table, MXFP4 experts)
@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Qwen3ForCausalLM", "GptOssForCausalLM"])
def test_rope_folded_into_split_decode_serves_what_the_rope_kernel_does(architecture, split_decode, monkeypatch):
    model = str(tiny_model_path(architecture))
    tokens, logprobs, decode_launches = _generate(model, True, monkeypatch)
    ref_tokens, ref_logprobs, ref_decode_launches = _generate(model, False, monkeypatch)
    assert ref_decode_launches > 0
    if architecture == "GptOssForCausalLM":
        # its sliding-window layers see too few keys to split: those keep the kernel
        assert 0 < decode_launches < ref_decode_launches
    else:  # every decode step folded the rotation and the KV write
        assert decode_launches == 0
    assert tokens == ref_tokens
    if platform.is_interpreter():
        assert logprobs == ref_logprobs  # the same bits
    else:  # a GPU may order the per-head norm's sum differently in the two kernels
        assert max(abs(a - b) for x, y in zip(logprobs, ref_logprobs) for a, b in zip(x, y)) < 1e-3
