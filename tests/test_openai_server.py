"""The OpenAI-compatible server: completions, chat, streaming, logprobs, errors, metrics, and the
async engine under it. Outputs are checked against the offline `LLM` on the same tiny model."""

import asyncio
import json
import time

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from live_server import live_server  # this folder (pytest puts it on sys.path)

from tritonllm import LLM, SamplingParams
from tritonllm.engine.async_engine import AsyncLLMEngine
from tritonllm.entrypoints.openai.app import build_app
from tritonllm.structured_output import StructuredOutputsParams

MODEL = "tiny"
PROMPT = "The baker opens her shop"
MESSAGES = [{"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def reference(tiny_llama) -> LLM:
    """The offline API on its own engine: the oracle for the server's outputs."""
    return LLM(model=tiny_llama, max_model_len=128, seed=0)


@pytest.fixture(scope="module")
def engine(tiny_llama):
    engine = AsyncLLMEngine(LLM(model=tiny_llama, max_model_len=128, seed=0).llm_engine)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def client(engine):
    with TestClient(build_app(engine, MODEL)) as client:
        yield client


def greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def has_unfinished_requests(engine: AsyncLLMEngine) -> bool:
    return asyncio.run(engine.call(lambda e: e.has_unfinished_requests()))


def generated_tokens(engine: AsyncLLMEngine) -> int:
    return asyncio.run(engine.call(lambda e: e.stats.generation_tokens))


def sse_events(body: str) -> list:
    """The JSON payloads of an SSE body; asserts it ends with [DONE]."""
    lines = [line[len("data: ") :] for line in body.split("\n\n") if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_completion_greedy_text_and_usage_match_offline_generate(client, reference):
    expected = reference.generate(PROMPT, greedy(6), use_tqdm=False)[0]
    r = client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL
    (choice,) = body["choices"]
    assert choice["text"] == expected.outputs[0].text
    assert choice["finish_reason"] == "length"
    prompt_tokens = len(expected.prompt_token_ids)
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 6, "total_tokens": prompt_tokens + 6}


def test_token_id_prompt_lists_give_one_choice_per_prompt(client, reference):
    tok = reference.get_tokenizer()
    prompts = [tok.encode("The river runs"), tok.encode("Numbers such as 7")]
    r = client.post("/v1/completions", json={"prompt": prompts, "max_tokens": 3, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    expected = reference.generate([{"prompt_token_ids": p} for p in prompts], greedy(3), use_tqdm=False)
    assert [c["text"] for c in body["choices"]] == [e.outputs[0].text for e in expected]
    assert body["usage"]["prompt_tokens"] == sum(map(len, prompts))
    assert body["usage"]["completion_tokens"] == 6


def test_n_samples_come_back_as_indexed_choices(client):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "n": 2, "max_tokens": 3, "seed": 7, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 6


def test_completion_logprobs_have_one_entry_per_token(client):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 3})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    num_tokens = r.json()["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert len(lp["tokens"]) == num_tokens
    assert all(x <= 0.0 for x in lp["token_logprobs"])
    assert all(1 <= len(top) <= 3 for top in lp["top_logprobs"])
    # greedy: the chosen token is the most probable one
    assert all(max(top.values()) == pytest.approx(x) for top, x in zip(lp["top_logprobs"], lp["token_logprobs"]))
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0


def test_chat_matches_offline_chat_with_logprobs_in_chat_format(client, reference):
    expected = reference.chat(MESSAGES, greedy(5), use_tqdm=False)[0]
    r = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": MESSAGES,
            "max_completion_tokens": 5,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": True,
            "top_logprobs": 2,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": expected.outputs[0].text}
    assert choice["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == len(expected.prompt_token_ids)
    content = choice["logprobs"]["content"]
    assert len(content) == 5
    for entry in content:
        assert len(entry["top_logprobs"]) == 2
        assert entry["logprob"] == pytest.approx(entry["top_logprobs"][0]["logprob"])
        assert entry["bytes"] == list(entry["token"].encode())


def test_echo_puts_the_prompt_and_its_logprobs_before_the_completion(client, reference):
    """echo=true: the prompt's text, tokens and logprobs (the first token's null) before the completion's,
    as the offline API's prompt_logprobs give them; streamed, the first chunk carries the prompt."""
    expected = reference.generate(PROMPT, greedy(4, logprobs=2, prompt_logprobs=2), use_tqdm=False)[0]
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "logprobs": 2, "echo": True}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    ids = expected.prompt_token_ids + expected.outputs[0].token_ids
    assert choice["text"] == PROMPT + expected.outputs[0].text
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    positions = expected.prompt_logprobs[1:] + expected.outputs[0].logprobs
    assert lp["token_logprobs"][1:] == pytest.approx([p[t].logprob for p, t in zip(positions, ids[1:])], abs=1e-5)
    assert all(len(top) == 2 for top in lp["top_logprobs"][1:])
    events = sse_events(client.post("/v1/completions", json={**body, "stream": True}).text)
    assert events[0]["choices"][0]["text"].startswith(PROMPT)
    assert "".join(c["text"] for e in events for c in e["choices"]) == choice["text"]
    streamed = [x for e in events for c in e["choices"] for x in c["logprobs"]["token_logprobs"]]
    assert streamed[0] is None and streamed[1:] == pytest.approx(lp["token_logprobs"][1:], abs=1e-5)


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_max_tokens_0_scores_the_prompt_alone(client, reference, stream):
    """lm-eval-harness's log-likelihood request: the prompt's logprobs, no completion tokens."""
    expected = reference.generate(PROMPT, greedy(1, prompt_logprobs=1), use_tqdm=False)[0]
    body = {"prompt": PROMPT, "max_tokens": 0, "logprobs": 1, "echo": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    if stream:
        events = sse_events(r.text)
        choice, usage = events[0]["choices"][0], events[-1]["usage"]
    else:
        choice, usage = r.json()["choices"][0], r.json()["usage"]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    ids = expected.prompt_token_ids
    want = [p[t].logprob for p, t in zip(expected.prompt_logprobs[1:], ids[1:])]
    assert choice["logprobs"]["token_logprobs"][0] is None
    assert choice["logprobs"]["token_logprobs"][1:] == pytest.approx(want, abs=1e-5)
    assert usage["completion_tokens"] == 0 and usage["prompt_tokens"] == len(ids)


def test_streamed_completion_deltas_join_to_the_whole_text_even_with_a_stop_string(client, reference):
    full = reference.generate(PROMPT, greedy(6), use_tqdm=False)[0].outputs[0].text
    stop = full.split()[2]  # a word in the middle: the output ends before it
    request = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stop": [" " + stop]}
    whole = client.post("/v1/completions", json=request).json()
    r = client.post("/v1/completions", json={**request, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    *chunks, usage_chunk = events
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    assert streamed == whole["choices"][0]["text"] == full[: full.index(" " + stop)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == whole["usage"]


def test_streamed_chat_sends_the_role_first_then_content_deltas(client, reference):
    expected = reference.chat(MESSAGES, greedy(5), use_tqdm=False)[0].outputs[0].text
    r = client.post(
        "/v1/chat/completions",
        json={"messages": MESSAGES, "max_tokens": 5, "temperature": 0, "ignore_eos": True, "stream": True},
    )
    assert r.status_code == 200, r.text
    chunks = sse_events(r.text)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["usage"] is None for c in chunks)  # no include_usage


@pytest.mark.parametrize(
    "path, body, words",
    [
        ("/v1/completions", {"model": "gpt-4", "prompt": "a"}, f"model={MODEL!r}"),
        ("/v1/completions", {"prompt": "a", "n": 0}, "n must be"),
        ("/v1/completions", {"prompt": "a", "temperature": -1}, "temperature"),
        ("/v1/completions", {"prompt": "a", "top_p": 0}, "top_p"),
        ("/v1/completions", {"prompt": "a", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"prompt": "a", "logprobs": 99}, "logprobs"),
        ("/v1/completions", {"prompt": "a", "temperature": "hot"}, "temperature"),
        ("/v1/completions", {"prompt": "a", "max_tokens": 0}, "max_tokens"),  # 0 only with echo
        ("/v1/completions", {"prompt": list(range(3, 203))}, "max_model_len"),
        ("/v1/completions", {"prompt": [5, 10**6]}, "prompt_token_ids must lie in"),
        ("/v1/completions", {"prompt": []}, "prompt is empty"),
        ("/v1/completions", {"prompt": "a", "stream": True, "n": 0}, "n must be"),
        ("/v1/completions", {"prompt": "a", "stream_options": {"include_usage": True}}, "stream"),
        ("/v1/completions", {"max_tokens": 3}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "unknown chat role"),
        ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, "logprobs=true"),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "presence_penalty": 2.5},
            "presence_penalty must be in [-2, 2]",
        ),
        ("/v1/completions", {"prompt": "a", "repetition_penalty": 0}, "repetition_penalty must be in [0.001, 1000]"),
        ("/v1/completions", {"prompt": "a", "logit_bias": {"x": 1}}, "logit_bias keys must be token ids"),
        ("/v1/completions", {"prompt": "a", "logit_bias": {"5": 300}}, "logit_bias values must be in [-100, 100]"),
        ("/v1/completions", {"prompt": "a", "logit_bias": {"99999": 1}}, "logit_bias names token 99999"),
        ("/v1/completions", {"prompt": "a", "guided_regex": "(open"}, "structured_outputs.regex does not compile"),
        ("/v1/completions", {"prompt": "a", "guided_regex": "a", "guided_choice": ["b"]}, "exactly one of"),
        ("/v1/completions", {"prompt": "a", "structured_outputs": {"xml": "<a/>"}}, "unknown: ['xml']"),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "response_format": {"type": "json_schema"}},
            "json_schema.schema",
        ),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "response_format": {"type": "json_object"}, "guided_choice": ["a"]},
            "give one of response_format",
        ),
        ("/v1/chat/completions", {"messages": []}, "messages"),
    ],
)
def test_bad_requests_get_a_400_naming_the_problem(client, path, body, words):
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "code"} and error["code"] == 400
    assert words in error["message"]


def test_server_keeps_serving_after_bad_requests(client, engine):
    for body in ({"prompt": list(range(3, 300)), "stream": True}, {"prompt": "a", "min_p": 2}):
        assert client.post("/v1/completions", json=body).status_code == 400
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert client.get("/health").status_code == 200
    assert not has_unfinished_requests(engine)


def test_models_health_and_metrics(client):
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [(m["id"], m["max_model_len"]) for m in models["data"]] == [(MODEL, 128)]
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    samples = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.text.splitlines()
        if line and not line.startswith("#") and "_bucket" not in line
    }
    assert samples["tritonllm:generation_tokens_total"] > 0
    assert samples["tritonllm:num_requests_running"] == 0
    assert samples["tritonllm:e2e_request_latency_seconds_count"] == samples["tritonllm:request_success_total"] > 0
    assert "# TYPE tritonllm:time_to_first_token_seconds histogram" in metrics.text


# ---- the async engine on its own -------------------------------------------------------------


def test_a_refused_prompt_raises_in_its_caller_while_others_finish(engine):
    async def run():
        async def last(prompt):
            return [o async for o in engine.generate(prompt, SamplingParams(max_tokens=3, ignore_eos=True))][-1]

        return await asyncio.gather(last(PROMPT), last(list(range(3, 300))), return_exceptions=True)

    good, bad = asyncio.run(run())
    assert isinstance(bad, ValueError) and "max_model_len" in str(bad)
    assert good.finished and len(good.outputs[0].token_ids) == 3


def test_a_consumer_that_stops_early_aborts_its_request(engine):
    before = generated_tokens(engine)

    async def run():
        stream = engine.generate(PROMPT, SamplingParams(max_tokens=100, ignore_eos=True), request_id="early")
        async for output in stream:
            assert not output.finished
            break
        await stream.aclose()
        for _ in range(100):
            if not await engine.call(lambda e: e.has_unfinished_requests()):
                return True
            await asyncio.sleep(0.05)
        return False

    assert asyncio.run(run())
    assert generated_tokens(engine) - before < 20


# ---- a real server, with the openai client ----------------------------------------------------


@pytest.fixture(scope="module")
def server_url(engine):
    with live_server(build_app(engine, MODEL)) as url:
        yield url


def test_openai_client_against_a_running_server(server_url, reference):
    client = openai.OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)
    expected = reference.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)[0]
    assert completion.choices[0].text == expected.outputs[0].text
    assert completion.usage.completion_tokens == len(expected.outputs[0].token_ids)

    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    expected_chat = reference.chat(MESSAGES, SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)[0]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected_chat.outputs[0].text
    assert chunks[-1].usage.completion_tokens == len(expected_chat.outputs[0].token_ids)
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        client.completions.create(model=MODEL, prompt=list(range(3, 300)), max_tokens=2)

    # structured outputs: OpenAI's response_format (chat) and vLLM's guided_choice (completions), as offline
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    chat = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=20, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    )  # fmt: skip
    structured = StructuredOutputsParams(json=schema)
    offline = reference.chat(MESSAGES, SamplingParams(temperature=0.0, max_tokens=20, structured_outputs=structured),
                             use_tqdm=False)[0].outputs[0]  # fmt: skip
    assert chat.choices[0].message.content == offline.text and isinstance(json.loads(offline.text)["ok"], bool)
    picked = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=3,
                                       extra_body={"guided_choice": ["red", "green", "blue"]})  # fmt: skip
    assert picked.choices[0].text in ("red", "green", "blue")

    # OpenAI's penalties and logit_bias, and vLLM's repetition_penalty (an extra field): as the offline API
    adjust = dict(presence_penalty=1.5, frequency_penalty=0.5, logit_bias={"300": 6.0})
    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, **adjust,
                                           extra_body={"repetition_penalty": 1.3, "ignore_eos": True})  # fmt: skip
    params = greedy(6, presence_penalty=1.5, frequency_penalty=0.5, logit_bias={300: 6.0}, repetition_penalty=1.3)
    expected = reference.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert completion.choices[0].text == expected.text
    assert expected.token_ids != reference.generate(PROMPT, greedy(6), use_tqdm=False)[0].outputs[0].token_ids


def test_a_client_disconnect_mid_stream_aborts_the_request(server_url, engine):
    before = generated_tokens(engine)
    body = {"prompt": PROMPT, "max_tokens": 100, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server_url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        next(r.iter_lines())
    deadline = time.monotonic() + 20
    while has_unfinished_requests(engine):
        assert time.monotonic() < deadline, "the disconnected request still runs"
        time.sleep(0.1)
    assert generated_tokens(engine) - before < 50  # stopped well before its 100 tokens
