"""What a step's special rows change in their logits before sampling (layers/sampler.LogitAdjustments):
min_tokens' bans of the stop tokens, logit_bias, the presence / frequency / repetition penalties, and a
structured output's allowed tokens.

The penalties count each row's generated tokens on the device: the host knows all but the token still
in flight under overlap scheduling, which the model runner gathers from its last sampled tokens before
this step overwrites them. Rows without any of these cost nothing: the fast path never comes here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tritonllm.engine.request import Request
from tritonllm.layers.sampler import LogitAdjustments, Penalties


@dataclass
class InFlight:
    """The tokens still in flight (under overlap scheduling) of some rows: indices into the step's sampled
    requests, the tokens on the device and, where a structured row needs them, a copy on its way to the host
    (valid once `ready` has completed: read it through host_tokens, after this step's forward was launched, so
    the wait for the previous step overlaps this one's forward instead of delaying its launch)."""

    indices: list[int]
    tokens: torch.Tensor
    host: torch.Tensor | None = None
    ready: torch.cuda.Event | None = None

    def host_tokens(self) -> list[int]:
        """The tokens on the host (waits for their copy)."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()


def _device(values: list[int] | np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values), dtype=dtype).to(device, non_blocking=True)


class TokenArrays:
    """A special row's token arrays, kept on the request across steps: its prompt and generated tokens (each
    step's penalties read them whole, and converting the lists again every step costs the host O(tokens) Python
    work a row and step: an 8k-token prompt, milliseconds a step; generated tokens are appended as they come), and
    its allowed_token_ids as bitmask words."""

    def __init__(self, prompt: list[int]) -> None:
        self.prompt = np.asarray(prompt, dtype=np.int64)
        self._output = np.empty(64, dtype=np.int64)
        self._count = 0
        self._allowed: np.ndarray | None = None

    def allowed(self, token_ids: list[int], vocab: int) -> np.ndarray:
        """allowed_words(token_ids, vocab), computed once (the request's allowed_token_ids do not change)."""
        if self._allowed is None or len(self._allowed) != (vocab + 31) // 32:
            self._allowed = allowed_words(token_ids, vocab)
        return self._allowed

    def output(self, tokens: list[int]) -> np.ndarray:
        """The generated tokens `tokens` (the request's list, which only grows) as an array."""
        n = len(tokens)
        if n < self._count:  # not expected (the list only grows): start over
            self._count = 0
        if n > len(self._output):  # room for at least as many again
            grown = np.empty(max(n, 2 * len(self._output)), dtype=np.int64)
            grown[: self._count] = self._output[: self._count]
            self._output = grown
        if n > self._count:
            self._output[self._count : n] = tokens[self._count : n]
            self._count = n
        return self._output[:n]

    @staticmethod
    def of(r: Request) -> TokenArrays:
        if r.token_arrays is None:
            r.token_arrays = TokenArrays(r.prompt_token_ids)
        return r.token_arrays


def _token_rows(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(which array, token) for every token of `arrays`, flattened."""
    lens = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
    tokens = np.concatenate(arrays) if arrays else np.empty(0, dtype=np.int64)
    return np.repeat(np.arange(len(arrays), dtype=np.int64), lens), tokens


def _penalties(
    sampled: list[Request],
    rows: list[int],
    flight: InFlight | None,
    vocab: int,
    device: torch.device,
) -> Penalties:
    params = [sampled[i].params for i in rows]
    counts = torch.zeros((len(rows), vocab), dtype=torch.int32, device=device)
    which, tokens = _token_rows([TokenArrays.of(sampled[i]).output(sampled[i].output_token_ids) for i in rows])
    if tokens.size:
        ones = torch.ones(tokens.size, dtype=torch.int32, device=device)
        counts.index_put_(
            (_device(which, torch.int64, device), _device(tokens, torch.int64, device)), ones, accumulate=True
        )
    if flight is not None:  # the tokens in flight of the penalized rows
        position = {i: k for k, i in enumerate(rows)}
        pairs = [(position[i], j) for j, i in enumerate(flight.indices) if i in position]
        if pairs:
            flight_rows = _device([k for k, _ in pairs], torch.int64, device)
            tokens = flight.tokens[_device([j for _, j in pairs], torch.int64, device)]
            ones = torch.ones(len(pairs), dtype=torch.int32, device=device)
            counts.index_put_((flight_rows, tokens.long()), ones, accumulate=True)
    prompt_mask = None
    if any(p.repetition_penalty != 1.0 for p in params):
        none = np.empty(0, dtype=np.int64)
        which, tokens = _token_rows([TokenArrays.of(sampled[i]).prompt if p.repetition_penalty != 1.0 else none
                                     for i, p in zip(rows, params)])  # fmt: skip
        prompt_mask = torch.zeros((len(rows), vocab), dtype=torch.bool, device=device)
        prompt_mask[_device(which, torch.int64, device), _device(tokens, torch.int64, device)] = True
    return Penalties(
        rows=_device(rows, torch.int64, device),
        counts=counts,
        prompt_mask=prompt_mask,
        frequency=_device([p.frequency_penalty for p in params], torch.float32, device),
        presence=_device([p.presence_penalty for p in params], torch.float32, device),
        repetition=_device([p.repetition_penalty for p in params], torch.float32, device),
    )


def allowed_words(token_ids: list[int], vocab: int) -> np.ndarray:
    """allowed_token_ids as a bitmask row: int32 words, bit t % 32 of word t // 32 set for each allowed t."""
    ids = np.asarray(token_ids, dtype=np.int64)
    words = np.zeros((vocab + 31) // 32, dtype=np.uint32)
    np.bitwise_or.at(words, ids // 32, np.left_shift(np.uint32(1), (ids % 32).astype(np.uint32)))
    return words.view(np.int32)


def _bitmask(
    sampled: list[Request], rows: list[int], flight: InFlight | None, vocab: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(rows, bitmask) of the rows still constrained: a structured output's matcher, first advanced by the
    tokens generated since it last was (the one in flight included), and / or allowed_token_ids."""
    in_flight = (
        dict(zip(flight.indices, flight.host_tokens())) if flight is not None and flight.host is not None else {}
    )
    bitmask = torch.full((len(rows), (vocab + 31) // 32), -1, dtype=torch.int32)  # every token allowed
    kept = []
    for i in rows:
        r = sampled[i]
        g = r.grammar
        constrained = False
        if g is not None:
            tokens = r.output_token_ids[g.accepted :]
            g.catch_up(tokens + [in_flight[i]] if i in in_flight else tokens, r.request_id)
            constrained = g.fill(bitmask, len(kept))
        if r.params.allowed_token_ids:
            bitmask[len(kept)] &= torch.from_numpy(TokenArrays.of(r).allowed(r.params.allowed_token_ids, vocab))
            constrained = True
        if constrained:
            kept.append(i)
    if not kept:
        return None
    return _device(kept, torch.int64, device), bitmask[: len(kept)].to(device, non_blocking=True)


def logit_adjustments(
    sampled: list[Request],
    special: list[int],
    flight: InFlight | None,
    vocab: int,
    device: torch.device,
) -> LogitAdjustments | None:
    """The adjustments of the logits rows `special` (indices into `sampled`, which are the logits' rows);
    flight: the tokens in flight of penalized and structured rows; None if nothing changes."""
    bias_rows: list[int] = []
    bias_tokens: list[int] = []
    bias_values: list[float] = []
    for i in special:
        r = sampled[i]
        p = r.params
        # tokens before this one: the known ones and the one still in flight, if any
        if len(r.output_token_ids) + r.num_output_placeholders - 1 < p.min_tokens:
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(r.eos_token_ids))
            stops = sorted(t for t in stops if t < vocab)  # an id past the vocabulary is never sampled anyway
            bias_rows += [i] * len(stops)
            bias_tokens += stops
            bias_values += [float("-inf")] * len(stops)
        if p.logit_bias:
            bias_rows += [i] * len(p.logit_bias)
            bias_tokens += list(p.logit_bias)
            bias_values += list(p.logit_bias.values())
    penalized = [i for i in special if sampled[i].params.has_penalties]
    structured = [i for i in special if sampled[i].grammar is not None or sampled[i].params.allowed_token_ids]
    mask = _bitmask(sampled, structured, flight, vocab, device) if structured else None
    if not bias_rows and not penalized and mask is None:
        return None
    adjust = LogitAdjustments()
    if mask is not None:
        adjust.mask_rows, adjust.bitmask = mask
    if bias_rows:
        adjust.bias_rows = _device(bias_rows, torch.int64, device)
        adjust.bias_tokens = _device(bias_tokens, torch.int64, device)
        adjust.bias_values = _device(bias_values, torch.float32, device)
    if penalized:
        adjust.penalties = _penalties(sampled, penalized, flight, vocab, device)
    return adjust
