"""A request's state inside the engine: its tokens, progress, blocks and outputs.

A user prompt with `n` samples becomes `n` requests (ids `ID` or `ID-i`) that share one prompt.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from tritonllm.outputs import PositionLogprobs
from tritonllm.sampling_params import SamplingParams
from tritonllm.structured_output import GrammarState


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"


_FINISHED = frozenset((RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED))


@dataclass
class RequestTimes:
    arrival: float = field(default_factory=time.monotonic)
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int  # base of this request's per-step sampling seeds
    max_tokens: int  # generated-token cap after max_model_len is applied
    eos_token_ids: frozenset[int]
    priority: int = 0  # lower runs first under the `priority` policy
    extra_keys: tuple = ()  # mixed into block hashes (room for LoRA / multimodal identity)
    arrival_index: int = 0  # set by the scheduler: order of arrival, for stable policy ordering
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose KV is in the cache once the scheduled steps ran
    # tokens sampled by steps in flight, not yet known on the host (overlap scheduling: 0 or 1)
    num_output_placeholders: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    cumulative_logprob: float = 0.0
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    prompt_logprobs: list[PositionLogprobs | None] = field(default_factory=list)
    output_text: str = ""
    times: RequestTimes = field(default_factory=RequestTimes)
    num_preemptions: int = 0
    group_index: int = 0  # which of its prompt's n samples
    grammar: GrammarState | None = None  # its structured output's matcher (structured_output.py)
    # a special row's tokens (penalties) and allowed_token_ids as numpy arrays, kept across steps
    # (worker/logit_adjust.TokenArrays)
    token_arrays: Any = None

    @property
    def num_tokens_with_placeholders(self) -> int:
        """Known tokens plus those sampled by steps in flight: where scheduling continues from."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_output_placeholders

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_range(self, start: int, end: int) -> list[int]:
        """Tokens start..end-1 of prompt + output, without copying the whole sequence (hot path)."""
        prompt_len = len(self.prompt_token_ids)
        if end <= prompt_len:
            return self.prompt_token_ids[start:end]
        if start >= prompt_len:
            return self.output_token_ids[start - prompt_len : end - prompt_len]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - prompt_len]

    @property
    def is_finished(self) -> bool:
        return self.status in _FINISHED
