"""Structured outputs (JSON schema, JSON object, regex, choice, grammar) against HF transformers generating
with xgrammar's own logits processor: greedy tokens equal, overlap scheduling on (the token in flight is
read back for the matcher) and off; sampled outputs always follow their grammar; bad grammars refused."""

from __future__ import annotations

import json
import re

import pytest
import torch
import xgrammar as xgr
from engine_checks import assert_serves_on_with_every_block_free  # tests/
from transformers import AutoModelForCausalLM, AutoTokenizer

from tritonllm import LLM, SamplingParams
from tritonllm.structured_output import StructuredOutputsParams
from tritonllm.worker.model_runner import ModelRunner

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}},
    "required": ["n", "ok"],
    "additionalProperties": False,
}
CASES = {
    "choice": StructuredOutputsParams(choice=["yes", "no", "maybe so"]),
    "regex": StructuredOutputsParams(regex="[0-9]{3}-[a-z]{2}"),
    "json": StructuredOutputsParams(json=SCHEMA),
    "grammar": StructuredOutputsParams(grammar='root ::= "(" [a-c]+ ")"'),
}
PROMPTS = [[5, 17, 42, 99, 7], [300, 301, 7, 8, 9, 10]]


def follows(kind: str, text: str) -> bool:
    if kind == "choice":
        return text in ("yes", "no", "maybe so")
    if kind == "regex":
        return re.fullmatch("[0-9]{3}-[a-z]{2}", text) is not None
    if kind == "grammar":
        return re.fullmatch(r"\([a-c]+\)", text) is not None
    value = json.loads(text)
    return set(value) == {"n", "ok"} and 0 <= value["n"] <= 99 and isinstance(value["ok"], bool)


@pytest.fixture(scope="module")
def hf(tiny_llama):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=model.config.vocab_size,
                                              stop_token_ids=[model.config.eos_token_id])  # fmt: skip
    return model, xgr.GrammarCompiler(info)


def hf_greedy(hf, prompt: list[int], params: StructuredOutputsParams, steps: int) -> list[int]:
    model, compiler = hf
    grammars = {
        "choice": lambda: compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in params.choice)),
        "regex": lambda: compiler.compile_regex(params.regex),
        "json": lambda: compiler.compile_json_schema(json.dumps(params.json), any_whitespace=False),
        "grammar": lambda: compiler.compile_grammar(params.grammar),
    }
    processor = xgr.contrib.hf.LogitsProcessor(grammars[params.kind]())
    out = model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False, logits_processor=[processor],
                         pad_token_id=0, eos_token_id=model.config.eos_token_id)  # fmt: skip
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_greedy_structured_outputs_match_hf_with_xgrammar(tiny_llama, hf, async_scheduling):
    llm = LLM(model=tiny_llama, max_model_len=128, seed=0, async_scheduling=async_scheduling)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS for _ in CASES]
    params = [
        SamplingParams(temperature=0.0, max_tokens=30, structured_outputs=c) for _ in PROMPTS for c in CASES.values()
    ]
    outs = llm.generate(prompts, params, use_tqdm=False)
    for k, out in enumerate(outs):
        kind, prompt = list(CASES)[k % len(CASES)], PROMPTS[k // len(CASES)]
        c = out.outputs[0]
        assert c.finish_reason == "stop" and follows(kind, c.text), (kind, c.text)
        assert c.token_ids == hf_greedy(hf, prompt, CASES[kind], 30), (kind, prompt)


def test_sampled_structured_outputs_follow_their_grammar(tiny_llama):
    """Sampled at temperature 1 (a random model's flat distributions: every allowed path is likely), batched
    with an unconstrained request, n = 2, overlap scheduling on."""
    llm = LLM(model=tiny_llama, max_model_len=128, seed=0, async_scheduling=True)
    kinds = list(CASES)
    params = [SamplingParams(temperature=1.0, n=2, seed=s, max_tokens=50, structured_outputs=CASES[k])
              for s, k in enumerate(kinds)]  # fmt: skip
    outs = llm.generate(["The answer is"] * len(kinds) + ["free text"], [*params, SamplingParams(max_tokens=8)],
                        use_tqdm=False)  # fmt: skip
    for kind, out in zip(kinds, outs):
        for c in out.outputs:
            assert c.finish_reason == "stop" and follows(kind, c.text), (kind, c.text)
    assert len({c.text for c in outs[kinds.index("json")].outputs}) > 1  # the samples differ


def test_a_matcher_that_misses_the_token_in_flight_is_caught(tiny_llama, monkeypatch):
    """Under overlap scheduling the matcher must take the token still on the device before it masks the
    next one; without it the mask is a step stale and the output breaks its grammar (or the matcher refuses)."""
    original = ModelRunner._in_flight_tokens
    monkeypatch.setattr(
        ModelRunner, "_in_flight_tokens", lambda self, in_flight, copy_back: original(self, in_flight, False)
    )
    llm = LLM(model=tiny_llama, max_model_len=128, seed=0, async_scheduling=True)
    params = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=40, structured_outputs=CASES["json"]) for s in range(4)
    ]
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS * 2], params, use_tqdm=False)
    except Exception as e:  # the matcher refused a token
        assert "breaks its structured output" in str(e)
        return
    assert not all(o.outputs[0].finish_reason == "stop" and follows("json", o.outputs[0].text) for o in outs)


def test_allowed_token_ids_narrow_a_structured_output(tiny_llama):
    """Both masks apply (their intersection): a choice whose first tokens are partly disallowed."""
    llm = LLM(model=tiny_llama, max_model_len=128, seed=0, async_scheduling=True)
    tokenizer = llm.get_tokenizer()
    choice = ["yes", "no"]
    yes, no = (tokenizer.encode(c, add_special_tokens=False) for c in choice)
    allowed = sorted(set(no) | set(llm.llm_engine.eos_token_ids))
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=10, allowed_token_ids=allowed,
                            structured_outputs=StructuredOutputsParams(choice=choice))  # fmt: skip
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert not set(yes) <= set(allowed) and all(o.outputs[0].text == "no" for o in outs)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({}, "exactly one of"),
        ({"regex": "a+", "choice": ["a"]}, "exactly one of"),
        ({"choice": []}, "non-empty list"),
        ({"grammar": ""}, "non-empty string"),
        ({"json": 5}, "JSON schema"),
    ],
)
def test_bad_structured_outputs_params_raise_value_error(kwargs, words):
    with pytest.raises(ValueError, match=words):
        StructuredOutputsParams(**kwargs)


def test_a_grammar_that_does_not_compile_is_refused_and_the_engine_keeps_serving(tiny_llama):
    llm = LLM(model=tiny_llama, max_model_len=128, seed=0)
    for bad in ({"regex": "(unclosed"}, {"json": '{"type": "object", "properties": 3'}, {"grammar": "root ::= ("}):
        kind = next(iter(bad))
        with pytest.raises(ValueError, match=f"structured_outputs.{kind} does not compile"):
            llm.generate([{"prompt_token_ids": [5, 6]}], SamplingParams(structured_outputs=bad), use_tqdm=False)
    assert_serves_on_with_every_block_free(llm)


@pytest.mark.gpu
def test_structured_outputs_in_decode_graphs_with_overlap_equal_eager_synchronous_steps(tiny_llama):
    """On the GPU: decode graphs, then the structured rows sampled again with the mask, the token in flight
    read back; the same tokens as eager, synchronous steps."""
    kw = dict(model=tiny_llama, dtype="bfloat16", max_model_len=128, seed=0, num_gpu_blocks_override=256)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS for _ in CASES]
    params = [
        SamplingParams(temperature=0.0, max_tokens=30, structured_outputs=c) for _ in PROMPTS for c in CASES.values()
    ]
    got = LLM(**kw, async_scheduling=True).generate(prompts, params, use_tqdm=False)
    expected = LLM(**kw, async_scheduling=False, enforce_eager=True).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    assert all(follows(list(CASES)[k % len(CASES)], o.outputs[0].text) for k, o in enumerate(got))
