"""POST /v1/completions: prompts (text or token ids, one or many) in, completions out, whole or streamed."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

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
    token_ids: list[int], positions: list[PositionLogprobs], num_top: int, text_offset: int
) -> CompletionLogprobs:
    """The completions API's logprobs: per token its text, logprob, top `num_top` and character offset."""
    out = CompletionLogprobs()
    for token_id, position in zip(token_ids, positions):
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


class OpenAIServingCompletion(OpenAIServing):
    async def create(self, request: CompletionRequest) -> CompletionResponse | AsyncIterator[str]:
        self.check_request(request)
        if request.echo:
            raise BadRequestError("echo=true is not supported: leave echo out")
        prompts = _prompts(request.prompt)
        params = self.sampling_params(request, request.max_tokens, request.logprobs)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        firsts, streams = await self.start(prompts, params, request_id)
        if request.stream:
            return sse_events(self._chunks(request_id, params, firsts, streams, wants_usage(request)))
        outputs = await final_outputs(firsts, streams)
        await self.fill_token_strings(outputs)
        choices = [
            CompletionChoice(
                index=i * params.n + c.index,
                text=c.text,
                logprobs=completion_logprobs(c.token_ids, c.logprobs, params.logprobs, 0)
                if params.logprobs is not None
                else None,
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
            )
            for i, output in enumerate(outputs)
            for c in output.outputs
        ]
        return CompletionResponse(id=request_id, model=self.served_model_name, choices=choices, usage=usage_of(outputs))

    async def _chunks(
        self,
        request_id: str,
        params: SamplingParams,
        firsts: list[RequestOutput],
        streams: list[AsyncIterator[RequestOutput]],
        include_usage: bool,
    ) -> AsyncIterator[str]:
        """The stream's data chunks (sse_events adds the error event and [DONE])."""
        trackers = [DeltaTracker(params) for _ in streams]
        text_offsets: dict[int, int] = {}
        async with aclosing(merged(firsts, streams)) as events:
            async for i, output in events:
                await self.fill_token_strings([output])
                choices = []
                for delta in trackers[i].deltas(output):
                    index = i * params.n + delta.index
                    logprobs = None
                    if params.logprobs is not None:
                        offset = text_offsets.get(index, 0)
                        logprobs = completion_logprobs(delta.token_ids, delta.logprobs, params.logprobs, offset)
                        text_offsets[index] = offset + sum(len(t) for t in logprobs.tokens)
                    choices.append(
                        CompletionChoice(
                            index=index,
                            text=delta.text,
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
