"""SamplingParams: how to sample one request, with vLLM's names and defaults."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tritonllm.structured_output import StructuredOutputsParams

MAX_LOGPROBS = 20
# below this a temperature is greedy, as in vLLM (_SAMPLING_EPS): the samplers divide the logits by it in
# float32, where a smaller one overflows (1e-45 is a float32 denormal: every positive logit becomes inf)
SAMPLING_EPS = 1e-5
# the smallest normal float32: the samplers compare top_p in float32, where a smaller positive top_p
# (1e-308 passes the (0, 1] check) would round to 0 and keep no token
FLOAT32_TINY = 1.1754943508222875e-38


class RequestOutputKind(enum.Enum):
    """When a request's outputs are returned (vLLM's names and values)."""

    CUMULATIVE = 0  # after every step that advanced it: everything so far
    DELTA = 1  # after every step that advanced it: only what is new (text that a stop string may still
    # remove is held back until it cannot); streams, without copying a growing history each step
    FINAL_ONLY = 2  # once, when it finishes (offline `generate`): text is decoded once, at the end


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    # OpenAI's penalties on the tokens generated so far: logit -= frequency_penalty * count +
    # presence_penalty * (count > 0); vLLM's repetition_penalty on prompt and generated tokens alike
    # (a positive logit divided by it, a negative one multiplied); logit_bias adds to a token's logit
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None  # only these may be sampled (vLLM's)
    # a JSON schema, JSON object, regex, choice or grammar the output must follow (structured_output.py)
    structured_outputs: StructuredOutputsParams | None = None
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # top-k logprobs per generated token (plus the sampled one)
    prompt_logprobs: int | None = None  # top-k logprobs per prompt token (plus the prompt one)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    detokenize: bool = True  # False: token ids only (benchmarks)
    # False: Logprob.decoded_token stays None, for a caller that decodes the strings itself off the
    # engine thread (the OpenAI server)
    logprob_token_strings: bool = True
    priority: int = 0
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    stop_strings: list[str] = field(init=False, repr=False)
    # the model runner samples such a request's rows again, eagerly, with logprobs taken or logits adjusted
    # (min_tokens, logit_bias, penalties, allowed_token_ids, structured_outputs): one flag for its per-step loop
    needs_special_sampling: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        need(isinstance(self.n, int) and self.n >= 1, f"n must be an integer >= 1, got {self.n!r}")
        need(self.temperature >= 0.0, f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        need(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        need(isinstance(self.top_k, int) and self.top_k >= -1, f"top_k must be -1, 0 (off) or >= 1, got {self.top_k}")
        need(0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            need(-2.0 <= value <= 2.0, f"{name} must be in [-2, 2] (0 is off), got {value}")
        # bounded so that a logit divided by it stays finite in float32 (vLLM asks only > 0)
        need(
            1e-3 <= self.repetition_penalty <= 1e3,
            f"repetition_penalty must be in [0.001, 1000] (1 is off), got {self.repetition_penalty}",
        )
        bias = dict(self.logit_bias or {})
        need(
            all(isinstance(t, int) and t >= 0 for t in bias),
            f"logit_bias keys must be token ids (integers >= 0), got {sorted(bias, key=str)[:4]!r}",
        )
        need(
            all(-100.0 <= b <= 100.0 for b in bias.values()),
            f"logit_bias values must be in [-100, 100], got {sorted(bias.values())[:: max(1, len(bias) - 1)]!r}",
        )
        self.logit_bias = {t: float(b) for t, b in bias.items()} or None
        if self.allowed_token_ids is not None:
            allowed = list(self.allowed_token_ids)
            need(
                bool(allowed) and all(isinstance(t, int) and t >= 0 for t in allowed),
                f"allowed_token_ids must be a non-empty list of token ids, got {self.allowed_token_ids!r}",
            )
            self.allowed_token_ids = allowed
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        need(
            self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
            f"structured_outputs must be a StructuredOutputsParams, got {self.structured_outputs!r}",
        )
        if self.temperature < SAMPLING_EPS:
            self.temperature = 0.0
        # any top_p below float32's smallest normal keeps just the most probable token(s), as that one does
        self.top_p = max(self.top_p, FLOAT32_TINY)
        need(self.seed is None or isinstance(self.seed, int), f"seed must be an integer or None, got {self.seed!r}")
        need(
            self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
            f"max_tokens must be an integer >= 1 or None, got {self.max_tokens!r}",
        )
        need(
            isinstance(self.min_tokens, int) and self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}"
        )
        need(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
        )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            need(
                value is None or (isinstance(value, int) and 0 <= value <= MAX_LOGPROBS),
                f"{name} must be None or an integer in [0, {MAX_LOGPROBS}], got {value!r}",
            )
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        need(
            all(isinstance(s, str) and s for s in stop),
            f"stop must be a non-empty string or list of them, got {self.stop!r}",
        )
        self.stop_strings = stop
        ids = list(self.stop_token_ids or [])
        need(
            all(isinstance(t, int) and t >= 0 for t in ids),
            f"stop_token_ids must be token ids, got {self.stop_token_ids!r}",
        )
        self.stop_token_ids = ids
        self.needs_special_sampling = (
            self.logprobs is not None
            or self.min_tokens > 0
            or self.logit_bias is not None
            or self.has_penalties
            or self.allowed_token_ids is not None
            or self.structured_outputs is not None
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        """Whether sampling depends on the tokens seen so far (presence, frequency or repetition)."""
        return bool(self.presence_penalty or self.frequency_penalty) or self.repetition_penalty != 1.0
