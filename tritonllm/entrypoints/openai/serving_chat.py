"""POST /v1/chat/completions: messages through the tokenizer's chat template (as `LLM.chat`), then
one engine request; the reply whole or streamed (a role delta first, then content deltas)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

import jinja2

from tritonllm.entrypoints.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatMessage,
    ChatStreamChoice,
    DeltaMessage,
    TokenLogprob,
    TopLogprob,
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
from tritonllm.sampling_params import MAX_LOGPROBS, SamplingParams


def chat_logprobs(token_ids: list[int], positions: list[PositionLogprobs], num_top: int) -> ChatLogprobs:
    def entry(token: str, logprob: float) -> TopLogprob:
        return TopLogprob(token=token, logprob=clamp(logprob), bytes=list(token.encode()))

    content = []
    for token_id, position in zip(token_ids, positions):
        sampled = position[token_id]
        token = sampled.decoded_token or ""
        top = [entry(lp.decoded_token or "", lp.logprob) for lp in top_entries(position, num_top)]
        content.append(TokenLogprob(**entry(token, sampled.logprob).model_dump(), top_logprobs=top))
    return ChatLogprobs(content=content)


def _message(message: ChatMessage) -> dict[str, str]:
    content = message.content
    if isinstance(content, list):
        if any(part.get("type") != "text" for part in content):
            raise BadRequestError("only text content parts ({'type': 'text', 'text': ...}) are supported")
        content = "".join(str(part.get("text", "")) for part in content)
    return {"role": message.role, "content": content or ""}


def chat_prompt_ids(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


class OpenAIServingChat(OpenAIServing):
    async def create(self, request: ChatCompletionRequest) -> ChatCompletionResponse | AsyncIterator[str]:
        self.check_request(request)
        if request.tools:
            raise BadRequestError("tool calling is not supported: leave tools out")
        if not request.messages:
            raise BadRequestError("messages is empty: give at least one message")
        if request.top_logprobs is not None:
            if not request.logprobs:
                raise BadRequestError("top_logprobs needs logprobs=true: set logprobs or leave top_logprobs out")
            if not 0 <= request.top_logprobs <= MAX_LOGPROBS:
                raise BadRequestError(f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {request.top_logprobs}")
        max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
        params = self.sampling_params(request, max_tokens, (request.top_logprobs or 0) if request.logprobs else None)
        messages = [_message(m) for m in request.messages]
        try:
            # the chat template in a worker thread: neither the engine thread nor the event loop waits for it
            prompt_ids = await asyncio.to_thread(
                chat_prompt_ids, self.engine.engine.tokenizer, messages, request.add_generation_prompt
            )
        except (ValueError, jinja2.TemplateError) as e:
            raise BadRequestError(f"the chat template refused the messages: {e}") from e
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        firsts, streams = await self.start([prompt_ids], params, request_id)
        if request.stream:
            return sse_events(self._chunks(request_id, params, firsts, streams, wants_usage(request)))
        (output,) = await final_outputs(firsts, streams)
        await self.fill_token_strings([output])
        choices = [
            ChatChoice(
                index=c.index,
                message=AssistantMessage(content=c.text),
                logprobs=chat_logprobs(c.token_ids, c.logprobs, params.logprobs)
                if params.logprobs is not None
                else None,
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
            )
            for c in output.outputs
        ]
        return ChatCompletionResponse(
            id=request_id, model=self.served_model_name, choices=choices, usage=usage_of([output])
        )

    def _chunk(self, request_id: str, choices: list[ChatStreamChoice]) -> str:
        return sse(ChatCompletionChunk(id=request_id, model=self.served_model_name, choices=choices).model_dump_json())

    async def _chunks(
        self,
        request_id: str,
        params: SamplingParams,
        firsts: list[RequestOutput],
        streams: list[AsyncIterator[RequestOutput]],
        include_usage: bool,
    ) -> AsyncIterator[str]:
        """The stream's data chunks (sse_events adds the error event and [DONE])."""
        tracker = DeltaTracker(params)
        for index in range(params.n):
            role = DeltaMessage(role="assistant", content="")
            yield self._chunk(request_id, [ChatStreamChoice(index=index, delta=role)])
        async with aclosing(merged(firsts, streams)) as events:
            async for _, output in events:
                await self.fill_token_strings([output])
                choices = [
                    ChatStreamChoice(
                        index=delta.index,
                        delta=DeltaMessage(content=delta.text),
                        logprobs=chat_logprobs(delta.token_ids, delta.logprobs, params.logprobs)
                        if params.logprobs is not None
                        else None,
                        finish_reason=delta.finish_reason,
                        stop_reason=delta.stop_reason,
                    )
                    for delta in tracker.deltas(output)
                ]
                if choices:
                    yield self._chunk(request_id, choices)
        if include_usage:
            usage = stream_usage(firsts, [tracker])
            chunk = ChatCompletionChunk(id=request_id, model=self.served_model_name, choices=[], usage=usage)
            yield sse(chunk.model_dump_json())
