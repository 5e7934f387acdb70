"""AsyncLLMEngine: the engine behind a server, driven from asyncio code.

The LLMEngine is not thread-safe, so one background thread owns it: it runs queued commands
(add, abort, reads) between steps, steps while requests are pending, and sleeps on a condition
when idle. Each request's outputs go back to its caller's event loop through a channel that holds
at most one pending output: one that arrives before the consumer took the last is merged into it
(deltas concatenated, a cumulative output replacing the older), so a slow client costs memory in
proportion to what it has not read, never a queue of copies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tritonllm.engine.engine import LLMEngine
from tritonllm.outputs import RequestOutput, merge_outputs
from tritonllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

T = TypeVar("T")


class EngineDeadError(RuntimeError):
    """The engine thread has stopped; no request can be served."""


class EngineStepError(RuntimeError):
    """The step running this request raised (the exception is logged with the request ids)."""


DEGRADED_AFTER_FAILURES = 3  # consecutive failed steps before /health reports the engine degraded


class EngineOverloadedError(RuntimeError):
    """More requests wait to start than the engine admits (`max_waiting_requests`): try again later."""


class _Channel:
    """One request's outputs, from the engine thread to its event loop (`put` runs on that loop)."""

    def __init__(self) -> None:
        self._items: deque[Any] = deque()  # RequestOutputs (at most one) and then maybe an exception
        self._ready = asyncio.Event()

    def put(self, item: Any) -> None:
        if self._items and isinstance(item, RequestOutput) and isinstance(self._items[-1], RequestOutput):
            self._items[-1] = merge_outputs(self._items[-1], item)
        else:
            self._items.append(item)
        self._ready.set()

    async def get(self) -> Any:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    channel: _Channel  # RequestOutput, or an exception to raise in the consumer


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine, max_waiting_requests: int | None = None) -> None:
        """`max_waiting_requests`: how many requests may wait for their first output (queued or in
        prefill) before `generate` refuses new ones with EngineOverloadedError; None: unbounded."""
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self.num_waiting = 0  # requests admitted whose first output has not arrived (event-loop side)
        self.consecutive_step_failures = 0
        self._cond = threading.Condition()
        self._commands: deque[Callable[[], None]] = deque()
        self._streams: dict[str, _Stream] = {}  # touched by the engine thread only
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tritonllm-engine", daemon=True)
        self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive()

    @property
    def is_healthy(self) -> bool:
        """Running, and not failing step after step (one failed step fails only its requests)."""
        return self.is_running and self.consecutive_step_failures < DEGRADED_AFTER_FAILURES

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the engine thread after its current step; pending requests are left unfinished."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout_s)

    # ---- asyncio side --------------------------------------------------------------------

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run `fn(engine)` on the engine thread between steps (e.g. the tokenizer, metrics)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def command() -> None:
            try:
                result = fn(self.engine)
            except Exception as e:
                _resolve(loop, future, error=e)
            else:
                _resolve(loop, future, result=result)

        self._submit(command)
        return await future

    async def get_metrics(self) -> list[Any]:
        return await self.call(lambda engine: engine.get_metrics())

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None,
        strict_max_tokens: bool = False,
    ) -> AsyncIterator[RequestOutput]:  # fmt: skip
        """Yield the request's outputs as `params.output_kind` asks (cumulative or deltas after each
        step that advanced it, or the final one; outputs the consumer had not taken yet come merged
        into one), the last one finished. Bad input (a too-long prompt, ids outside the vocabulary,
        with `strict_max_tokens` a max_tokens that does not fit the context after the prompt...)
        raises ValueError from the first iteration; beyond `max_waiting_requests`, EngineOverloadedError, and the request never
        reaches the engine. Stopping early (a client disconnect) aborts the request."""
        request_id = request_id or uuid.uuid4().hex
        if self.max_waiting_requests is not None and self.num_waiting >= self.max_waiting_requests:
            raise EngineOverloadedError(
                f"{self.num_waiting} requests are waiting to start (the limit is {self.max_waiting_requests}): retry later"
            )
        loop = asyncio.get_running_loop()
        channel = _Channel()

        def add(engine: LLMEngine) -> None:
            text = prompt if isinstance(prompt, str) else None
            if strict_max_tokens and params.max_tokens is not None and len(token_ids) < engine.max_model_len:
                check_context(len(token_ids), params.max_tokens, engine.max_model_len)  # (add_request refuses the rest)
            engine.add_request(request_id, token_ids, params, prompt=text)
            self._streams[request_id] = _Stream(loop, channel)

        finished = False  # or rejected: nothing to abort
        self.num_waiting += 1
        waiting = True
        try:
            try:
                # tokenized in a worker thread: the engine thread only schedules and runs steps
                token_ids = (
                    await asyncio.to_thread(self.engine.tokenizer.encode, prompt)
                    if isinstance(prompt, str)
                    else list(prompt)
                )
                await self.call(add)
            except Exception:
                finished = True
                raise
            while not finished:
                item = await channel.get()
                if waiting:
                    waiting = False
                    self.num_waiting -= 1
                if isinstance(item, BaseException):
                    finished = True  # the engine thread already dropped the request
                    raise item
                finished = item.finished
                yield item
        finally:
            if waiting:
                self.num_waiting -= 1
            if not finished:
                # FIFO commands: this abort runs after the add, even if the add is still queued
                with contextlib.suppress(EngineDeadError):  # a stopped engine has dropped it already
                    self._submit(lambda: self._abort(request_id))

    def _submit(self, command: Callable[[], None]) -> None:
        with self._cond:
            if self._stopping or not self._thread.is_alive():
                raise EngineDeadError("the engine thread has stopped: restart the server")
            self._commands.append(command)
            self._cond.notify()

    # ---- engine thread -------------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                while not (self._commands or self._stopping or engine.has_unfinished_requests()):
                    self._cond.wait()
                stopping = self._stopping  # no command comes after this: _submit refuses them
                commands = list(self._commands)
                self._commands.clear()
            for command in commands:  # run even when stopping, so that no caller waits forever
                try:
                    command()
                except Exception:  # commands report their own errors; this one must not stop the thread
                    logger.exception("engine command failed")
            if stopping:
                break
            if engine.has_unfinished_requests():
                self._step()
        for request_id in list(self._streams):
            self._fail(request_id, EngineDeadError("the engine was shut down"))

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception:
            # the engine aborted the requests of the failed step (and freed their blocks); fail their
            # streams, keep the others (waiting requests run in later steps) and keep serving
            live = self.engine.output_processor.groups
            failed = [request_id for request_id in self._streams if request_id not in live]
            self.consecutive_step_failures += 1
            logger.exception("engine step failed; failing request(s) %s", ", ".join(failed) or "none")
            for request_id in failed:
                self._fail(request_id, EngineStepError(f"the engine step serving request {request_id} failed"))
            return
        self.consecutive_step_failures = 0
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            if output.finished:
                del self._streams[output.request_id]
            if not _put(stream, output):
                self._abort(output.request_id)  # the caller's event loop is gone

    def _fail(self, request_id: str, error: BaseException) -> None:
        stream = self._streams.get(request_id)
        self._abort(request_id)
        if stream is not None:
            _put(stream, error)

    def _abort(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self.engine.abort_request(request_id)


def check_context(prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    """Refuse a request whose prompt plus max_tokens exceeds the context (vLLM's server does; the
    offline engine clips max_tokens instead)."""
    if prompt_tokens + max_tokens > max_model_len:
        raise ValueError(
            f"max_tokens ({max_tokens}) plus the prompt's {prompt_tokens} tokens exceed the context "
            f"(max_model_len {max_model_len}): lower max_tokens to at most {max(max_model_len - prompt_tokens, 0)} "
            "or shorten the prompt"
        )


def _put(stream: _Stream, item: Any) -> bool:
    try:
        stream.loop.call_soon_threadsafe(stream.channel.put, item)
    except RuntimeError:  # loop closed
        return False
    return True


def _resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result: Any = None, error: Any = None) -> None:
    def set_future() -> None:
        if future.cancelled():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(set_future)
    except RuntimeError:  # the caller's loop is closed: nobody waits for this result
        pass
