"""Turns the logits of the rows that sample into tokens and, when asked, logprobs.

Sampling runs on the device (the `sampling` op of kernels/registry.py) and returns device tensors: nothing here waits for the
GPU, so a step's sampling can sit inside a CUDA graph and its tokens can feed the next step on the
device. Logprobs are those of the model's raw distribution (before logit_bias, penalties,
temperature and filters), as in vLLM. Rows with logit_bias, min_tokens, penalties, allowed_token_ids
or a structured output are sampled again, eagerly, with their logits adjusted (model_runner's special rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonllm.kernels.registry import Kernels, default_kernels


@dataclass
class Penalties:
    """Presence, frequency and repetition penalties of some rows (OpenAI's and vLLM's definitions):
    counts of each row's generated tokens and, where a repetition penalty needs it, which tokens its
    prompt holds."""

    rows: torch.Tensor  # [num_penalized] int64: rows of the logits
    counts: torch.Tensor  # [num_penalized, vocab] int32: how often each token was generated
    prompt_mask: torch.Tensor | None  # [num_penalized, vocab] bool: in the prompt; None: no repetition penalty
    frequency: torch.Tensor  # [num_penalized] float32
    presence: torch.Tensor  # [num_penalized] float32
    repetition: torch.Tensor  # [num_penalized] float32; 1 = off


@dataclass
class LogitAdjustments:
    """What changes some rows' logits before sampling, in vLLM's order: additive (row, token, value)
    entries first (logit_bias, and -inf for min_tokens' banned stop tokens), then the penalties, then a
    structured output's bitmask."""

    bias_rows: torch.Tensor | None = None  # [num_entries] int64
    bias_tokens: torch.Tensor | None = None  # [num_entries] int64
    bias_values: torch.Tensor | None = None  # [num_entries] float32
    penalties: Penalties | None = None
    mask_rows: torch.Tensor | None = None  # [num_masked] int64: rows a structured output or allowed_token_ids constrain
    bitmask: torch.Tensor | None = None  # [num_masked, ceil(vocab / 32)] int32: bit t % 32 of word t // 32 = t allowed

    def apply(self, logits: torch.Tensor, kernels: Kernels) -> torch.Tensor:
        """The adjusted logits (a copy: the caller's stay as they are)."""
        logits = logits.clone()
        if self.bias_rows is not None:
            logits.index_put_((self.bias_rows, self.bias_tokens), self.bias_values.to(logits.dtype), accumulate=True)
        p = self.penalties
        if p is not None:
            kernels.apply_penalties(logits, p.rows, p.counts, p.prompt_mask, p.frequency, p.presence, p.repetition)
        if self.mask_rows is not None:  # last: nothing after it can lift a disallowed token
            kernels.apply_token_bitmask(logits, self.mask_rows, self.bitmask)
        return logits


@dataclass
class SamplingTensors:
    temperature: torch.Tensor  # [num_rows] float32; 0 = greedy
    top_k: torch.Tensor  # [num_rows] int32; <= 0 = off
    top_p: torch.Tensor  # [num_rows] float32; 1 = off
    min_p: torch.Tensor  # [num_rows] float32; 0 = off
    seeds: torch.Tensor  # [num_rows] int64: this step's seed of each row
    max_num_logprobs: int | None  # top-k logprobs to return; None: no logprobs at all
    adjust: LogitAdjustments | None = None  # logit_bias, min_tokens' bans, penalties, masks; None: none


@dataclass
class TopLogprobs:
    """Host lists, one entry per row: the top-k tokens and the chosen token's logprob and rank."""

    top_ids: list[list[int]]
    top_logprobs: list[list[float]]
    token_logprobs: list[float]
    token_ranks: list[int]


@dataclass
class LogprobTensors:
    """TopLogprobs as tensors (on the device, or their host copies): [rows, k] ids and logprobs,
    [rows] chosen-token logprobs and ranks."""

    top_ids: torch.Tensor
    top_logprobs: torch.Tensor
    token_logprobs: torch.Tensor
    token_ranks: torch.Tensor

    def to_host(self) -> LogprobTensors:
        """Start non-blocking copies to host memory (valid once the step's event has completed)."""
        return LogprobTensors(*(to_host(t) for t in (self.top_ids, self.top_logprobs, self.token_logprobs, self.token_ranks)))  # fmt: skip

    def tolist(self) -> TopLogprobs:
        return TopLogprobs(
            self.top_ids.tolist(), self.top_logprobs.tolist(), self.token_logprobs.tolist(), self.token_ranks.tolist()
        )


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy of `t`: non-blocking into pinned memory from a GPU (read it after the copy's
    event), a snapshot on CPU (so a later step that overwrites `t` does not change it)."""
    return t.to("cpu", non_blocking=True) if t.is_cuda else t.clone()


def top_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, k: int) -> LogprobTensors:
    """logprobs [rows, vocab] float32, token_ids [rows] -> top-k plus each chosen token's logprob and rank."""
    token_lp = logprobs.gather(-1, token_ids.long()[:, None])[:, 0]
    ranks = (logprobs > token_lp[:, None]).sum(-1) + 1
    top_vals, top_ids = logprobs.topk(k, dim=-1) if k > 0 else (logprobs[:, :0], token_ids[:, None][:, :0])
    return LogprobTensors(top_ids, top_vals, token_lp, ranks)


class Sampler:
    def __init__(self, kernels: Kernels | None = None) -> None:
        self.kernels = kernels or default_kernels()

    def __call__(self, logits: torch.Tensor, st: SamplingTensors) -> tuple[torch.Tensor, LogprobTensors | None]:
        """logits [rows, vocab] -> (token ids [rows] int64, their logprobs when asked), on the device."""
        logprobs = self.kernels.log_softmax(logits) if st.max_num_logprobs is not None else None
        if st.adjust is not None:  # after the logprobs: those are the model's, as in vLLM
            logits = st.adjust.apply(logits, self.kernels)
        token_ids = self.kernels.sample(logits, st.temperature, st.top_k, st.top_p, st.min_p, st.seeds)
        top = top_logprobs(logprobs, token_ids, st.max_num_logprobs) if logprobs is not None else None
        return token_ids, top
