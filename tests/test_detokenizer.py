"""Detokenization at O(1) per token: streamed text equals the whole output's decode, pending tokens
stay bounded (ids that decode to nothing), logprob strings come from one batched call; the
covering tokenizer of the benchmark models decodes every id to text."""

import random

import pytest
from transformers import AutoTokenizer

from tritonllm import LLM, SamplingParams
from tritonllm.engine.detokenizer import (
    MAX_PENDING_TOKENS,
    StreamDetokenizer,
    TokenStrings,
    WindowDetokenizer,
    backend_tokenizer,
    make_detokenizer,
)
from tritonllm.models.covering_tokenizer import make_covering_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    return AutoTokenizer.from_pretrained(tiny_llama)


def stream(detok, ids: list[int]) -> str:
    return "".join(detok.append(t) for t in ids) + detok.flush()


def random_ids(tokenizer, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(len(tokenizer)) for _ in range(n)]


@pytest.mark.parametrize("kind", ["stream", "window"])
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_streamed_text_equals_the_whole_decode(tokenizer, kind, skip_special_tokens):
    # random ids split multi-byte characters across tokens and hit special tokens
    ids = random_ids(tokenizer, 300, seed=1) + tokenizer.encode("wörld, 日本 and 🙂 the engine")
    detok = (
        StreamDetokenizer(backend_tokenizer(tokenizer), skip_special_tokens)
        if kind == "stream"
        else WindowDetokenizer(tokenizer, skip_special_tokens)
    )
    assert stream(detok, ids) == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_fast_tokenizers_stream_and_the_window_is_the_fallback(tokenizer):
    assert isinstance(make_detokenizer(tokenizer, True), StreamDetokenizer)

    class Slow:  # a tokenizer without a `tokenizers` backend
        decode = tokenizer.decode

    assert isinstance(make_detokenizer(Slow(), True), WindowDetokenizer)


@pytest.mark.parametrize("kind", ["stream", "window"])
def test_tokens_that_decode_to_nothing_keep_the_pending_window_bounded(tokenizer, kind):
    """Ids outside the tokenizer's vocabulary (a 151,936-token model with a small tokenizer) decode
    to nothing; the old window grew with each of them and re-decoded all of it every token."""
    detok = (
        StreamDetokenizer(backend_tokenizer(tokenizer), True)
        if kind == "stream"
        else WindowDetokenizer(tokenizer, True)
    )
    text_ids = tokenizer.encode("The baker opens her shop", add_special_tokens=False)
    out = ""
    for i in range(400):
        out += detok.append(len(tokenizer) + i)  # out of the vocabulary
        pending = detok.pending if kind == "stream" else detok.window
        assert len(pending) <= 2 * MAX_PENDING_TOKENS
    out += stream(detok, text_ids)
    assert out == "The baker opens her shop"


def test_logprob_strings_are_decoded_in_one_batched_call_and_cached(tokenizer):
    strings = TokenStrings(tokenizer)
    calls = []
    decode_batch = strings.backend.decode_batch

    class Counting:
        def decode_batch(self, batch, skip_special_tokens):
            calls.append(len(batch))
            return decode_batch(batch, skip_special_tokens=skip_special_tokens)

    strings.backend = Counting()
    ids = random_ids(tokenizer, 200, seed=2)
    strings.add(ids)
    strings.add(ids[:50])  # all known: no call
    assert calls == [len(set(ids))]
    assert all(strings[t] == tokenizer.decode([t]) for t in ids)


def test_offline_text_decoded_at_the_end_equals_the_streamed_text(tiny_llama):
    # detokenization is host-side: the torch reference kernels give it the same kind of token stream as
    # the Triton ones (which the HF-parity tests check) without the interpreter's ~80 s for 48 steps
    llm = LLM(model=tiny_llama, max_model_len=128, kernel_backend="torch_ref")
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=24, ignore_eos=True)
    prompts = [[random.Random(i).randrange(5, 640) for _ in range(6)] for i in range(3)]
    offline = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    engine = llm.llm_engine
    for i, p in enumerate(prompts):
        engine.add_request(f"s{i}", p, params)
    streamed = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            streamed[out.request_id] = out.outputs[0].text
    tok = llm.get_tokenizer()
    for i, out in enumerate(offline):
        assert (
            out.outputs[0].text == streamed[f"s{i}"] == tok.decode(out.outputs[0].token_ids, skip_special_tokens=True)
        )


def test_covering_tokenizer_decodes_every_id_to_text(tmp_path):
    vocab_size, bos, eos = 5000, 4990, 4999
    tok = make_covering_tokenizer(vocab_size, {bos: "<|bos|>", eos: "<|eos|>"})
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == vocab_size and loaded.bos_token_id == bos and loaded.eos_token_id == eos
    texts = loaded.backend_tokenizer.decode_batch([[i] for i in range(vocab_size)], skip_special_tokens=True)
    assert all(texts[i] for i in range(vocab_size) if i not in (bos, eos))
    assert len({texts[i] for i in range(256, vocab_size) if i not in (bos, eos)}) == vocab_size - 258  # distinct
    assert loaded.decode(loaded.encode(" the quick brown fox", add_special_tokens=False)) == " the quick brown fox"
    with pytest.raises(ValueError, match="vocab_size"):
        make_covering_tokenizer(100, {})
