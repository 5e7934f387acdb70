"""What the completion and chat endpoints share: request checks, SamplingParams, starting engine
requests (so bad input is a 400 before any byte is streamed), merging streams, and text deltas."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from dataclasses import dataclass

from tritonllm.engine.async_engine import AsyncLLMEngine
from tritonllm.engine.detokenizer import TokenStrings
from tritonllm.entrypoints.openai.limits import ServerLimits
from tritonllm.entrypoints.openai.middleware import internal_error_message
from tritonllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse, SamplingFields, Usage
from tritonllm.outputs import Logprob, PositionLogprobs, RequestOutput
from tritonllm.sampling_params import RequestOutputKind, SamplingParams
from tritonllm.structured_output import KINDS, StructuredOutputsParams

logger = logging.getLogger(__name__)
# JSON has no -inf; vLLM clamps the same way
MIN_LOGPROB = -9999.0


class BadRequestError(Exception):
    """Turned into an HTTP 400 with an OpenAI-style error body."""


class RequestTimeoutError(Exception):
    """A request that ran past the server's --request-timeout (aborted): HTTP 408."""


def error_response(message: str, status_code: int = 400, kind: str = "BadRequestError") -> ErrorResponse:
    return ErrorResponse(error=ErrorInfo(message=message, type=kind, code=status_code))


def sse(payload: str) -> str:
    return f"data: {payload}\n\n"


def sse_error(message: str, status_code: int = 500, kind: str = "InternalServerError") -> str:
    return sse(json.dumps(error_response(message, status_code, kind).model_dump()))


SSE_DONE = sse("[DONE]")


async def sse_events(chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """A streamed response's events: the endpoint's chunks; if producing them fails, an error event
    (the headers are already sent); then [DONE]. Closing this (a client that disconnects) closes the
    chunks, which aborts their engine requests."""
    try:
        async with aclosing(chunks) as events:
            async for chunk in events:
                yield chunk
    except RequestTimeoutError as e:  # headers are sent: the error goes in the stream
        yield sse_error(str(e), 408, "TimeoutError")
    except Exception:  # an internal failure: logged with the request id, which is all the client learns
        logger.exception("stream failed")
        yield sse_error(internal_error_message())
    yield SSE_DONE


def wants_usage(request: SamplingFields) -> bool:
    """Whether a streamed request asked for a final usage chunk (stream_options.include_usage)."""
    return request.stream_options is not None and request.stream_options.include_usage


class OpenAIServing:
    def __init__(self, engine: AsyncLLMEngine, served_model_name: str, limits: ServerLimits | None = None) -> None:
        self.engine = engine
        self.served_model_name = served_model_name
        self.limits = limits or ServerLimits()
        # logprob entries' token strings, decoded here in a worker thread rather than on the engine thread
        self.token_strings = TokenStrings(engine.engine.tokenizer)

    async def fill_token_strings(self, outputs: list[RequestOutput]) -> None:
        """Set decoded_token on the logprob entries the engine left without (logprob_token_strings False)."""
        positions = [p for o in outputs for c in o.outputs for p in (c.logprobs or [])]
        positions += [p for o in outputs for p in (o.prompt_logprobs or []) if p is not None]
        if positions:
            await asyncio.to_thread(_fill_token_strings, self.token_strings, positions)

    def check_request(self, request: SamplingFields) -> None:
        cap = self.limits.max_n
        if request.n > cap:
            raise BadRequestError(
                f"n={request.n} exceeds this server's limit of {cap}: ask for at most {cap} completions"
            )
        best_of = getattr(request, "best_of", None)
        if best_of is not None and best_of > cap:
            raise BadRequestError(f"best_of={best_of} exceeds this server's limit of {cap}")
        if best_of is not None and best_of != request.n:
            raise BadRequestError(
                f"best_of={best_of} with n={request.n} is not supported: leave best_of out or set it to n"
            )
        if request.model is not None and request.model != self.served_model_name:
            raise BadRequestError(
                f"model {request.model!r} is not served here: use model={self.served_model_name!r} (see /v1/models)"
            )
        if request.stream_options is not None and not request.stream:
            raise BadRequestError("stream_options needs stream=true: set stream or leave stream_options out")

    def sampling_params(
        self, request: SamplingFields, max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None = None
    ) -> SamplingParams:
        """The request's SamplingParams: streams take deltas from the engine (only what each step
        added, held back where a stop string may still cut), other requests only the final output."""
        optional = {
            name: getattr(request, name)
            for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
            if getattr(request, name) is not None
        }
        try:
            return SamplingParams(
                n=request.n,
                seed=request.seed,
                presence_penalty=request.presence_penalty,
                frequency_penalty=request.frequency_penalty,
                logit_bias=logit_bias(request.logit_bias),
                allowed_token_ids=request.allowed_token_ids,
                structured_outputs=structured_outputs(request),
                max_tokens=max_tokens,
                min_tokens=request.min_tokens,
                stop=request.stop,
                stop_token_ids=request.stop_token_ids,
                ignore_eos=request.ignore_eos,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                include_stop_str_in_output=request.include_stop_str_in_output,
                skip_special_tokens=request.skip_special_tokens,
                output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
                logprob_token_strings=False,  # fill_token_strings decodes them off the engine thread
                **optional,
            )
        except ValueError as e:
            raise BadRequestError(str(e)) from e

    async def start(
        self, prompts: list[str | list[int]], params: SamplingParams, request_id: str
    ) -> tuple[list[RequestOutput], list[AsyncIterator[RequestOutput]]]:
        """Add one engine request per prompt and wait for each one's first output, so that a refused
        prompt is a 400 (and the others are aborted) before anything is sent."""
        if len(prompts) > self.limits.max_prompts_per_request:
            raise BadRequestError(
                f"{len(prompts)} prompts in one request exceed this server's limit of "
                f"{self.limits.max_prompts_per_request}: split them over several requests"
            )
        if params.structured_outputs is not None:  # compiled off the engine thread (the engine's compile then hits
            # the compiler's cache); a grammar that does not compile is a 400
            try:
                await asyncio.to_thread(self.engine.engine.structured_outputs.compile, params.structured_outputs)
            except ValueError as e:
                raise BadRequestError(str(e)) from e
        streams = [
            self.engine.generate(prompt, params, f"{request_id}-{i}" if len(prompts) > 1 else request_id, True)
            for i, prompt in enumerate(prompts)
        ]
        if self.limits.request_timeout_s is not None:
            deadline = asyncio.get_running_loop().time() + self.limits.request_timeout_s
            streams = [with_deadline(stream, deadline, self.limits.request_timeout_s) for stream in streams]
        try:
            firsts = await _gather_or_cancel([stream.__anext__() for stream in streams])
        except BaseException as e:
            for stream in streams:
                await stream.aclose()
            if isinstance(e, ValueError):
                raise BadRequestError(str(e)) from e
            raise
        return firsts, streams


def structured_outputs(request: SamplingFields) -> StructuredOutputsParams | None:
    """The request's structured output from whichever of response_format, structured_outputs and guided_*
    it used (one at most)."""
    asked: dict[str, dict] = {}
    fmt = request.response_format
    if fmt is not None and fmt.type == "json_object":
        asked["response_format"] = {"json_object": True}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise BadRequestError('response_format of type json_schema needs json_schema.schema: {"json_schema": '
                                  '{"name": ..., "schema": {...}}}')  # fmt: skip
        asked["response_format"] = {"json": fmt.json_schema.schema_}
    if request.structured_outputs:
        asked["structured_outputs"] = dict(request.structured_outputs)
    guided = {k: getattr(request, f"guided_{k}") for k in ("json", "regex", "choice", "grammar")}
    guided = {k: v for k, v in guided.items() if v is not None}
    if guided:
        asked["guided_*"] = guided
    if not asked:
        return None
    if len(asked) > 1:
        raise BadRequestError(
            f"give one of response_format, structured_outputs or guided_* fields, got {sorted(asked)}"
        )
    (kwargs,) = asked.values()
    unknown = sorted(set(kwargs) - set(KINDS))
    if unknown:
        raise BadRequestError(f"structured_outputs takes {', '.join(KINDS)}; unknown: {unknown}")
    try:
        return StructuredOutputsParams(**kwargs)
    except ValueError as e:
        raise BadRequestError(str(e)) from e


def logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's logit_bias (token ids as JSON object keys) with integer keys."""
    if not bias:
        return None
    try:
        return {int(token): value for token, value in bias.items()}
    except ValueError as e:
        raise BadRequestError(f"logit_bias keys must be token ids, got {sorted(bias)[:4]!r}") from e


async def with_deadline(
    stream: AsyncIterator[RequestOutput], deadline: float, timeout_s: float
) -> AsyncIterator[RequestOutput]:
    """`stream`'s outputs until `deadline` (the event loop's clock); then RequestTimeoutError, and the
    cancelled wait aborts the engine request."""
    loop = asyncio.get_running_loop()
    async with aclosing(stream) as outputs:
        while True:
            try:
                output = await asyncio.wait_for(outputs.__anext__(), max(deadline - loop.time(), 0.0))
            except StopAsyncIteration:
                return
            except TimeoutError as e:
                raise RequestTimeoutError(
                    f"the request ran past this server's timeout of {timeout_s:g} s and was aborted: "
                    "lower max_tokens or n, or raise --request-timeout"
                ) from e
            yield output


async def _gather_or_cancel(awaitables: list[Awaitable]) -> list:
    """gather, but on the first failure cancel the others (aborting their requests) and wait for them."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def final_outputs(
    firsts: list[RequestOutput], streams: list[AsyncIterator[RequestOutput]]
) -> list[RequestOutput]:
    async def last(output: RequestOutput, stream: AsyncIterator[RequestOutput]) -> RequestOutput:
        async for update in stream:
            output = update
        return output

    return await _gather_or_cancel([last(f, s) for f, s in zip(firsts, streams)])


async def merged(
    firsts: list[RequestOutput], streams: list[AsyncIterator[RequestOutput]]
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from every stream as outputs arrive; closing this aborts the rest."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for output in stream:
                queue.put_nowait((i, output))
        except Exception as e:
            queue.put_nowait((i, e))
        queue.put_nowait((i, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        for i, first in enumerate(firsts):
            yield i, first
        remaining = len(streams)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()


def usage_of(outputs: list[RequestOutput]) -> Usage:
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    completion_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return Usage(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
    )


def top_entries(position: PositionLogprobs, num_top: int) -> list[Logprob]:
    """The `num_top` most probable tokens at one position, best first (the sampled one is extra)."""
    ranked = [lp for lp in position.values() if lp.rank is not None and lp.rank <= num_top]
    return sorted(ranked, key=lambda lp: lp.rank)


def clamp(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


@dataclass
class Delta:
    """What one completion gained since the last chunk."""

    index: int  # the completion's index within its prompt's n samples
    text: str
    text_offset: int  # characters of this completion sent before `text`
    token_ids: list[int]
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None
    stop_reason: int | str | None


def _fill_token_strings(strings: TokenStrings, positions: list[PositionLogprobs]) -> None:
    strings.add(t for position in positions for t in position)
    for position in positions:
        for token, lp in position.items():
            if lp.decoded_token is None:
                lp.decoded_token = strings[token]


class DeltaTracker:
    """Turns one request's delta outputs (RequestOutputKind.DELTA: the engine already holds back the
    text a stop string may still remove) into stream chunks: tokens whose text is still empty wait
    for the next chunk unless logprobs are sent; it counts what each completion sent."""

    def __init__(self, params: SamplingParams) -> None:
        self.sent_chars = [0] * params.n
        self.done = [False] * params.n
        self.num_tokens = [0] * params.n  # every token received, sent or pending
        self.pending: list[tuple[list[int], list[PositionLogprobs] | None]] = [([], None) for _ in range(params.n)]

    def deltas(self, output: RequestOutput) -> list[Delta]:
        out = []
        for c in output.outputs:
            i = c.index
            if self.done[i]:
                continue
            tokens, logprobs = self.pending[i]
            tokens = tokens + c.token_ids
            if c.logprobs is not None:
                logprobs = (logprobs or []) + c.logprobs
            self.num_tokens[i] += len(c.token_ids)
            finished = c.finish_reason is not None
            if not c.text and not finished and (logprobs is None or not tokens):
                self.pending[i] = (tokens, logprobs)
                continue
            out.append(Delta(i, c.text, self.sent_chars[i], tokens, logprobs, c.finish_reason, c.stop_reason))
            self.sent_chars[i] += len(c.text)
            self.pending[i] = ([], None)
            self.done[i] = finished
        return out


def stream_usage(firsts: list[RequestOutput], trackers: list[DeltaTracker]) -> Usage:
    """A stream's usage from its trackers' token counts (delta outputs carry no totals)."""
    prompt_tokens = sum(len(o.prompt_token_ids) for o in firsts)
    completion_tokens = sum(sum(t.num_tokens) for t in trackers)
    return Usage(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
    )
