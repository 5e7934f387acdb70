"""POST /v1/completions: prompts (text or token ids, one or many) in, completions out, whole or streamed."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, replace

from tritonllm.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from tritonllm.entrypoints.openai.serving import (
    BadRequestError,
    DeltaTracker,
    OpenAIServing,
    clamp,
    final_outputs,
    merged,
    sse,
    sse_events,
    stream_usage,
    top_entries,
    usage_of,
    wants_usage,
)
from tritonllm.outputs import PositionLogprobs, RequestOutput
from tritonllm.sampling_params import SamplingParams


def completion_logprobs(
    token_ids: list[int],
    positions: list[PositionLogprobs | None],
    num_top: int,
    text_offset: int,
    first_token: str | None = None,
) -> CompletionLogprobs:
    """The completions API's logprobs: per token its text, logprob, top `num_top` and character offset.
    A position of None is an echoed prompt's first token (its text `first_token`): no logprob, no top."""
    out = CompletionLogprobs()
    for token_id, position in zip(token_ids, positions):
        if position is None:
            out.tokens.append(first_token or "")
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            out.text_offset.append(text_offset)
            text_offset += len(first_token or "")
            continue
        sampled = position[token_id]
        token = sampled.decoded_token or ""
        out.tokens.append(token)
        out.token_logprobs.append(clamp(sampled.logprob))
        out.top_logprobs.append({lp.decoded_token or "": clamp(lp.logprob) for lp in top_entries(position, num_top)})
        out.text_offset.append(text_offset)
        text_offset += len(token)
    return out


def _prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise BadRequestError("prompt is empty: give a string, a list of strings or token ids")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    return list(prompt)


@dataclass
class Echo:
    """What echo=true puts before a prompt's completions: its text, token ids and (with logprobs) the
    prompt logprobs (the first position None) with its first token's text."""

    text: str
    token_ids: list[int]
    positions: list[PositionLogprobs | None] | None
    first_token: str

    def before(
        self, text: str, token_ids: list[int], positions: list[PositionLogprobs] | None
    ) -> tuple[str, list[int], list[PositionLogprobs | None] | None, str]:
        """A completion's (text, token ids, logprob positions) with the prompt put first, and the first
        token's text (completion_logprobs' first_token)."""
        joined = self.positions + positions if self.positions is not None and positions is not None else None
        return self.text + text, self.token_ids + token_ids, joined, self.first_token


class OpenAIServingCompletion(OpenAIServing):
    async def create(self, request: CompletionRequest) -> CompletionResponse | AsyncIterator[str]:
        self.check_request(request)
        # echo with max_tokens 0 (lm-eval-harness's log-likelihoods): the prompt alone; the engine samples
        # one token, dropped, as vLLM does
        echo_only = request.echo and request.max_tokens == 0
        prompt_logprobs = request.logprobs if request.echo else None
        prompts = _prompts(request.prompt)
        max_tokens = 1 if echo_only else request.max_tokens
        params = self.sampling_params(request, max_tokens, request.logprobs, prompt_logprobs)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        firsts, streams = await self.start(prompts, params, request_id)
        if request.stream and not echo_only:
            chunks = self._chunks(request_id, params, prompts, firsts, streams, wants_usage(request), request.echo)
            return sse_events(chunks)
        outputs = await final_outputs(firsts, streams)
        await self.fill_token_strings(outputs)
        echoes = [await self.echo(prompt, output) for prompt, output in zip(prompts, outputs)] if request.echo else None
        choices = []
        for i, output in enumerate(outputs):
            for c in output.outputs:
                text, token_ids, positions, first = c.text, c.token_ids, c.logprobs, None
                if echo_only:
                    text, token_ids, positions = "", [], []
                if echoes is not None:
                    text, token_ids, positions, first = echoes[i].before(text, token_ids, positions)
                logprobs = None
                if params.logprobs is not None:
                    logprobs = completion_logprobs(token_ids, positions, params.logprobs, 0, first)
                reason = "length" if echo_only else c.finish_reason
                choices.append(
                    CompletionChoice(
                        index=i * params.n + c.index,
                        text=text,
                        logprobs=logprobs,
                        finish_reason=reason,
                        stop_reason=None if echo_only else c.stop_reason,
                    )  # fmt: skip
                )
        usage = usage_of(outputs)
        if echo_only:
            usage.completion_tokens, usage.total_tokens = 0, usage.prompt_tokens
        response = CompletionResponse(id=request_id, model=self.served_model_name, choices=choices, usage=usage)
        if request.stream:  # echo_only, streamed: the whole answer as one chunk
            return sse_events(_one_chunk(response, wants_usage(request)))
        return response

    async def echo(self, prompt: str | list[int], output: RequestOutput) -> Echo:
        """The echo of one prompt (its token strings decoded off the event loop)."""
        ids = output.prompt_token_ids

        def decode() -> tuple[str, str]:
            self.token_strings.add(ids[:1])
            text = prompt if isinstance(prompt, str) else self.token_strings.tokenizer.decode(ids)
            return text, self.token_strings[ids[0]]

        text, first = await asyncio.to_thread(decode)
        return Echo(text, list(ids), output.prompt_logprobs, first)

    async def _chunks(
        self,
        request_id: str,
        params: SamplingParams,
        prompts: list[str | list[int]],
        firsts: list[RequestOutput],
        streams: list[AsyncIterator[RequestOutput]],
        include_usage: bool,
        echo: bool,
    ) -> AsyncIterator[str]:
        """The stream's data chunks (sse_events adds the error event and [DONE]). With echo, each
        completion's first chunk starts with its prompt (the prompt logprobs gathered from the deltas)."""
        trackers = [DeltaTracker(params) for _ in streams]
        text_offsets: dict[int, int] = {}
        prompt_positions: list[list] = [[] for _ in streams]
        echoed: set[int] = set()
        async with aclosing(merged(firsts, streams)) as events:
            async for i, output in events:
                await self.fill_token_strings([output])
                prompt_positions[i] += output.prompt_logprobs or []
                choices = []
                for delta in trackers[i].deltas(output):
                    index = i * params.n + delta.index
                    text, token_ids, positions, first = delta.text, delta.token_ids, delta.logprobs, None
                    if echo and index not in echoed:
                        echoed.add(index)
                        e = await self.echo(prompts[i], replace(output, prompt_logprobs=prompt_positions[i] or None))
                        text, token_ids, positions, first = e.before(text, token_ids, positions)
                    logprobs = None
                    if params.logprobs is not None:
                        offset = text_offsets.get(index, 0)
                        logprobs = completion_logprobs(token_ids, positions, params.logprobs, offset, first)
                        text_offsets[index] = offset + sum(len(t) for t in logprobs.tokens)
                    choices.append(
                        CompletionChoice(
                            index=index,
                            text=text,
                            logprobs=logprobs,
                            finish_reason=delta.finish_reason,
                            stop_reason=delta.stop_reason,
                        )
                    )
                if choices:
                    chunk = CompletionResponse(id=request_id, model=self.served_model_name, choices=choices)
                    yield sse(chunk.model_dump_json())
        if include_usage:
            usage = stream_usage(firsts, trackers)
            chunk = CompletionResponse(id=request_id, model=self.served_model_name, choices=[], usage=usage)
            yield sse(chunk.model_dump_json())


async def _one_chunk(response: CompletionResponse, include_usage: bool) -> AsyncIterator[str]:
    """A finished response as a stream: its choices in one chunk, then the usage chunk if asked."""
    usage, response.usage = response.usage, None
    yield sse(response.model_dump_json())
    if include_usage:
        yield sse(response.model_copy(update={"choices": [], "usage": usage}).model_dump_json())
