"""The offline API's contract (vLLM's): parameters, stops, seeds, n, logprobs, chat, bad input."""

import pytest
import torch

from tritonllm import LLM, SamplingParams
from tritonllm.outputs import Logprob


@pytest.fixture(scope="module")
def llm(tiny_llama) -> LLM:
    return LLM(model=tiny_llama, max_model_len=128, seed=0)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"n": 0}, "n"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"logprobs": 99}, "logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-3]}, "stop_token_ids"),
    ],
)
def test_bad_sampling_params_raise_value_error_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_string_and_token_id_prompts_give_the_same_output(llm):
    params = SamplingParams(temperature=0.0, max_tokens=6)
    ids = llm.get_tokenizer().encode("The baker opens her shop")
    by_text, by_ids = llm.generate(["The baker opens her shop", {"prompt_token_ids": ids}], params, use_tqdm=False)
    assert by_text.prompt_token_ids == ids == by_ids.prompt_token_ids
    assert by_text.outputs[0].token_ids == by_ids.outputs[0].token_ids
    assert by_text.outputs[0].text == llm.get_tokenizer().decode(by_text.outputs[0].token_ids, skip_special_tokens=True)


def test_outputs_come_back_in_prompt_order_with_max_tokens_per_prompt(llm):
    prompts = ["a", "the river runs", "numbers such as 7"]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (3, 1, 5)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.prompt for o in outs] == prompts
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 1, 5]
    assert all(o.outputs[0].finish_reason == "length" and o.finished for o in outs)


def test_seed_reproduces_samples_whatever_the_batch(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=8, ignore_eos=True)
    alone = llm.generate(["The weather changed"], params, use_tqdm=False)[0].outputs[0].token_ids
    batch = llm.generate(
        ["Something else entirely", "The weather changed"],
        [SamplingParams(temperature=1.0, max_tokens=8), params],
        use_tqdm=False,
    )
    assert batch[1].outputs[0].token_ids == alone
    other = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=99, max_tokens=8, ignore_eos=True)
    assert llm.generate(["The weather changed"], other, use_tqdm=False)[0].outputs[0].token_ids != alone


def test_out_of_range_top_k_and_seed_are_served(llm):
    """A top_k past int32 keeps every token (as top_k off); a seed past int64 or negative seeds like any
    other (the server's fuzzer found both crashing a step)."""
    kw = dict(temperature=1.0, max_tokens=6, ignore_eos=True)
    prompt = ["The weather changed"]
    off = llm.generate(prompt, SamplingParams(top_k=0, seed=5, **kw), use_tqdm=False)[0].outputs[0].token_ids
    huge = llm.generate(prompt, SamplingParams(top_k=15929151547, seed=5, **kw), use_tqdm=False)[0].outputs[0].token_ids
    assert huge == off
    for seed in (2**80, -3):
        got = llm.generate(prompt, SamplingParams(seed=seed, **kw), use_tqdm=False)[0].outputs[0].token_ids
        same = llm.generate(prompt, SamplingParams(seed=seed % 2**62, **kw), use_tqdm=False)[0].outputs[0].token_ids
        assert got == same and len(got) == 6


@pytest.mark.parametrize("sampler", ["auto", "torch_ref"])
def test_vanishing_temperature_and_top_p_are_served_greedily(tiny_llama, sampler):
    """A temperature below 1e-5 is greedy (vLLM's rule: dividing the logits by 1e-45, a float32 denormal,
    made every positive logit inf and the reference sampler's draw fail), and a top_p below float32's smallest
    normal (1e-308 passes the (0, 1] check but is 0 in float32, keeping no token) keeps the most probable
    token, as the server's fuzzer found. Both samplers; the tokens are the greedy ones."""
    assert SamplingParams(temperature=1e-30).temperature == 0.0 and SamplingParams(temperature=1e-5).temperature
    assert 0 < SamplingParams(top_p=1e-308).top_p == torch.finfo(torch.float32).tiny
    llm = LLM(model=tiny_llama, max_model_len=128, seed=0, kernels=None if sampler == "auto" else {"sampling": sampler})
    kw = dict(max_tokens=5, ignore_eos=True, seed=3)
    prompt = ["0.1.0"]
    greedy = llm.generate(prompt, SamplingParams(temperature=0.0, **kw), use_tqdm=False)[0].outputs[0].token_ids
    for params in (dict(top_p=1.1125369292536007e-308), dict(temperature=1e-45), dict(temperature=1e-30, top_p=1e-40)):
        got = llm.generate(prompt, SamplingParams(**params, **kw), use_tqdm=False)[0].outputs[0].token_ids
        assert got == greedy, params


def test_n_returns_n_distinct_completions(llm):
    out = llm.generate(
        ["Good tests compare"], SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6), use_tqdm=False
    )
    assert [c.index for c in out[0].outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out[0].outputs}) > 1


def test_stop_token_ids_and_eos_end_generation(llm):
    free = llm.generate(
        ["The library"], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True), use_tqdm=False
    )
    tokens = free[0].outputs[0].token_ids
    stop_at = tokens[3]
    first = tokens.index(stop_at)
    out = llm.generate(
        ["The library"], SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[stop_at]), use_tqdm=False
    )[0].outputs[0]
    assert out.token_ids == tokens[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at


def test_min_tokens_forbids_stop_tokens_until_reached(llm):
    free = llm.generate(["The library"], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    first = free[0].outputs[0].token_ids[0]
    out = llm.generate(
        ["The library"],
        SamplingParams(temperature=0.0, max_tokens=6, min_tokens=3, stop_token_ids=[first]),
        use_tqdm=False,
    )[0].outputs[0]
    assert out.token_ids[0] != first
    assert len(out.token_ids) >= 3


def test_min_tokens_with_a_stop_id_past_the_vocabulary_is_served(llm):
    """Such an id can never be sampled; banning it indexed past the logits (a device-side error on a GPU)."""
    params = SamplingParams(temperature=0.0, max_tokens=4, min_tokens=2, stop_token_ids=[10**6])
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], params, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) >= 2


def test_stop_string_truncates_text(llm):
    free = llm.generate(
        ["In the garden"], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), use_tqdm=False
    )
    text = free[0].outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip() and "\ufffd" not in stop
    out = llm.generate(
        ["In the garden"], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=stop), use_tqdm=False
    )[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[: text.index(stop)]
    kept = llm.generate(
        ["In the garden"],
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[stop], include_stop_str_in_output=True),
        use_tqdm=False,
    )[0].outputs[0]
    assert kept.text == text[: text.index(stop) + len(stop)]


def test_logprobs_hold_top_k_plus_sampled_token(llm):
    out = llm.generate(
        ["Numbers such as"],
        SamplingParams(temperature=1.0, seed=3, max_tokens=4, logprobs=2, prompt_logprobs=1),
        use_tqdm=False,
    )[0]
    for token, entry in zip(out.outputs[0].token_ids, out.outputs[0].logprobs):
        assert token in entry and 2 <= len(entry) <= 3
        assert all(isinstance(lp, Logprob) and lp.logprob <= 0 and lp.rank >= 1 for lp in entry.values())
        assert {lp.rank for t, lp in entry.items() if t != token} <= {1, 2}
    assert out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids)
    for token, entry in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]):
        assert token in entry and entry[token].decoded_token is not None


def test_prompt_logprobs_in_slices_equal_the_whole(llm, monkeypatch):
    """Prompt logprobs are computed PROMPT_LOGPROBS_ROWS positions at a time (bounded memory); slices
    of 3 give the same values as one slice."""
    from tritonllm.worker import model_runner

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=2)
    prompt = "The baker opens her shop at dawn, and the street smells of bread"
    whole = llm.generate([prompt], params, use_tqdm=False)[0].prompt_logprobs
    monkeypatch.setattr(model_runner, "PROMPT_LOGPROBS_ROWS", 3)
    sliced = llm.generate([prompt], params, use_tqdm=False)[0].prompt_logprobs
    assert len(whole) == len(sliced) > 7
    for a, b in zip(whole[1:], sliced[1:]):
        assert a.keys() == b.keys()
        assert all(abs(a[t].logprob - b[t].logprob) < 1e-5 and a[t].rank == b[t].rank for t in a)


def test_chat_applies_the_chat_template(llm):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    out = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)[0]
    expected = llm.get_tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert llm.get_tokenizer().decode(out.prompt_token_ids) == expected
    assert len(out.outputs[0].token_ids) >= 1


def test_prompt_longer_than_max_model_len_is_refused(llm):
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([{"prompt_token_ids": [5] * 200}], SamplingParams(max_tokens=2), use_tqdm=False)


def test_out_of_vocab_prompt_token_is_refused(llm):
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate([{"prompt_token_ids": [5, 10**6]}], use_tqdm=False)


def test_generation_stops_at_max_model_len(llm):
    out = llm.generate(
        [{"prompt_token_ids": [7] * 120}], SamplingParams(max_tokens=50, ignore_eos=True), use_tqdm=False
    )
    assert len(out[0].outputs[0].token_ids) == 8 and out[0].outputs[0].finish_reason == "length"


def test_blocks_are_all_free_after_generate(llm):
    llm.generate(["x", "y z"], SamplingParams(max_tokens=3), use_tqdm=False)
    kv = llm.llm_engine.kv_cache
    kv.check_invariant()
    assert kv.num_free_blocks == kv.num_blocks


def test_an_unknown_quantization_is_refused_naming_the_supported_ones(tiny_llama):
    with pytest.raises(
        ValueError,
        match=r"quantization='fp4' is not supported: online quantization is one of \['fp8', 'int8', 'mxfp8', 'int4', 'mxfp4'\]",
    ):
        LLM(model=tiny_llama, quantization="fp4")
