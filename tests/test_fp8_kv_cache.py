"""kv_cache_dtype="fp8": e4m3 K/V with per-layer scales, end to end against the unquantized cache."""

import pytest
import torch

from tritonllm import LLM, SamplingParams, platform


def test_fp8_cache_takes_one_byte_per_element(tiny_llama):
    full = LLM(model=tiny_llama, max_model_len=128)
    fp8 = LLM(model=tiny_llama, max_model_len=128, kv_cache_dtype="fp8")
    assert fp8.llm_engine.runner.kv_caches[0][0].dtype == platform.fp8_e4m3_dtype()
    ratio = full.llm_engine.runner.kv_bytes_per_block() / fp8.llm_engine.runner.kv_bytes_per_block()
    assert ratio == full.llm_engine.dtype.itemsize


def prompt_logprob_diffs(a_outputs, b_outputs) -> torch.Tensor:
    diffs = []
    for a, b in zip(a_outputs, b_outputs):
        for pos, (ea, eb) in enumerate(zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:])):
            token = a.prompt_token_ids[pos + 1]
            diffs.append(abs(ea[token].logprob - eb[token].logprob))
    return torch.tensor(diffs)


PROMPTS = [{"prompt_token_ids": list(range(10 + i, 40 + 3 * i))} for i in range(3)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, prompt_logprobs=0)


def test_fp8_engine_matches_the_fp8_torch_reference(tiny_llama):
    """Same quantisation in both backends: the Triton path computes what the reference defines."""
    triton_out = LLM(model=tiny_llama, max_model_len=128, kv_cache_dtype="fp8").generate(
        PROMPTS, PARAMS, use_tqdm=False
    )
    ref_out = LLM(model=tiny_llama, max_model_len=128, kv_cache_dtype="fp8", kernel_backend="torch_ref").generate(
        PROMPTS, PARAMS, use_tqdm=False
    )
    assert prompt_logprob_diffs(triton_out, ref_out).max() < 2e-3
    assert [o.outputs[0].token_ids for o in triton_out] == [o.outputs[0].token_ids for o in ref_out]


def test_fp8_cache_accuracy_against_the_full_precision_cache(tiny_llama):
    """e4m3 keeps 3 mantissa bits (~2.7% relative error on this model's K/V, |K| ~ 2); the tiny
    model's attention is sharp (scores ~ 4), so prompt logprobs move by ~0.2 on average."""
    full = LLM(model=tiny_llama, max_model_len=128).generate(PROMPTS, PARAMS, use_tqdm=False)
    fp8 = LLM(model=tiny_llama, max_model_len=128, kv_cache_dtype="fp8").generate(PROMPTS, PARAMS, use_tqdm=False)
    diffs = prompt_logprob_diffs(full, fp8)
    assert diffs.mean() < 0.3 and diffs.max() < 1.0


def test_unknown_kv_cache_dtype_is_refused(tiny_llama):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(model=tiny_llama, kv_cache_dtype="int3")
