"""What `LLM.generate` returns, with vLLM's names: RequestOutput, CompletionOutput, Logprob."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None  # 1 = most probable token
    decoded_token: str | None = None


# One dict per position: the top-k tokens plus the sampled (or prompt) token.
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None = None  # "stop", "length", "abort" or None while running
    stop_reason: int | str | None = None  # the stop string or stop token that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Monotonic timestamps (s) of one request, and the derived latencies (s)."""

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None

    @property
    def queue_s(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def first_token_s(self) -> float | None:
        """Time to first token (TTFT)."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    delta: bool = False  # RequestOutputKind.DELTA: outputs, prompt_logprobs hold only what is new


def merge_outputs(older: RequestOutput, newer: RequestOutput) -> RequestOutput:
    """One output standing for two successive ones of a request: the newer for cumulative outputs;
    for deltas (RequestOutputKind.DELTA) their concatenation, completion by completion."""
    if not newer.delta:
        return newer
    by_index = {c.index: c for c in older.outputs}
    merged = []
    for c in newer.outputs:
        o = by_index.get(c.index)
        if o is None:
            merged.append(c)
            continue
        logprobs = None if c.logprobs is None else (o.logprobs or []) + c.logprobs
        merged.append(
            CompletionOutput(
                c.index,
                o.text + c.text,
                o.token_ids + c.token_ids,
                c.cumulative_logprob,
                logprobs,
                c.finish_reason,
                c.stop_reason,
            )  # fmt: skip
        )
    prompt_logprobs = older.prompt_logprobs
    if newer.prompt_logprobs is not None:
        prompt_logprobs = (prompt_logprobs or []) + newer.prompt_logprobs
    return RequestOutput(newer.request_id, newer.prompt, newer.prompt_token_ids, prompt_logprobs, merged,
                         newer.finished, newer.metrics, newer.delta)  # fmt: skip
