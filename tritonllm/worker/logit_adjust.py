"""What a step's special rows change in their logits before sampling (layers/sampler.LogitAdjustments):
min_tokens' bans of the stop tokens, logit_bias, and the presence / frequency / repetition penalties.

The penalties count each row's generated tokens on the device: the host knows all but the token still
in flight under overlap scheduling, which the model runner gathers from its last sampled tokens before
this step overwrites them. Rows without any of these cost nothing: the fast path never comes here.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from tritonllm.engine.request import Request
from tritonllm.layers.sampler import LogitAdjustments, Penalties


def _device(values: list[int] | np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values), dtype=dtype).to(device, non_blocking=True)


def _token_rows(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(which list, token) for every token of `lists`, flattened."""
    lens = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    tokens = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64, count=int(lens.sum()))
    return np.repeat(np.arange(len(lists), dtype=np.int64), lens), tokens


def _penalties(
    sampled: list[Request],
    rows: list[int],
    flight: tuple[list[int], torch.Tensor] | None,
    vocab: int,
    device: torch.device,
) -> Penalties:
    params = [sampled[i].params for i in rows]
    counts = torch.zeros((len(rows), vocab), dtype=torch.int32, device=device)
    which, tokens = _token_rows([sampled[i].output_token_ids for i in rows])
    if tokens.size:
        ones = torch.ones(tokens.size, dtype=torch.int32, device=device)
        counts.index_put_(
            (_device(which, torch.int64, device), _device(tokens, torch.int64, device)), ones, accumulate=True
        )
    if flight is not None:  # the tokens in flight (their rows are all penalized ones)
        position = {i: k for k, i in enumerate(rows)}
        flight_rows = _device([position[i] for i in flight[0]], torch.int64, device)
        ones = torch.ones(len(flight[0]), dtype=torch.int32, device=device)
        counts.index_put_((flight_rows, flight[1].long()), ones, accumulate=True)
    prompt_mask = None
    if any(p.repetition_penalty != 1.0 for p in params):
        which, tokens = _token_rows([sampled[i].prompt_token_ids if p.repetition_penalty != 1.0 else []
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


def logit_adjustments(
    sampled: list[Request],
    special: list[int],
    flight: tuple[list[int], torch.Tensor] | None,
    vocab: int,
    device: torch.device,
) -> LogitAdjustments | None:
    """The adjustments of the logits rows `special` (indices into `sampled`, which are the logits' rows);
    flight: (indices into `sampled`, their tokens in flight on the device) of penalized rows; None if
    nothing changes."""
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
    if not bias_rows and not penalized:
        return None
    adjust = LogitAdjustments()
    if bias_rows:
        adjust.bias_rows = _device(bias_rows, torch.int64, device)
        adjust.bias_tokens = _device(bias_tokens, torch.int64, device)
        adjust.bias_values = _device(bias_values, torch.float32, device)
    if penalized:
        adjust.penalties = _penalties(sampled, penalized, flight, vocab, device)
    return adjust
