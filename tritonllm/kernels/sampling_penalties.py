"""Presence, frequency and repetition penalties on some rows of the logits, in place: the `sampling`
op's `apply_penalties` entry; and `apply_token_bitmask`, a structured output's allowed tokens
(kernels/reference.py holds the torch references).

For each penalized row p (logits row rows[p]) and token t, with c = counts[p, t] (how often t was
generated) and seen = c > 0 or prompt_mask[p, t]:
    logit = seen ? (logit > 0 ? logit / repetition[p] : logit * repetition[p]) : logit    (vLLM)
    logit -= frequency[p] * c + presence[p] * (c > 0)                                      (OpenAI)
One program per (row, block of the vocabulary); only the penalized rows are read and written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonllm.kernels.registry import FLOATS, Supports, register


@triton.jit
def _penalties_kernel(
    logits_ptr, stride_logits, rows_ptr, counts_ptr, stride_counts, prompt_ptr, stride_prompt,
    frequency_ptr, presence_ptr, repetition_ptr, vocab,
    HAS_PROMPT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    p = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < vocab
    row = tl.load(rows_ptr + p)
    ptrs = logits_ptr + row * stride_logits + cols
    logit = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    count = tl.load(counts_ptr + p * stride_counts + cols, mask=mask, other=0)
    generated = count > 0
    seen = generated
    if HAS_PROMPT:
        seen = seen | (tl.load(prompt_ptr + p * stride_prompt + cols, mask=mask, other=0) != 0)
    repetition = tl.load(repetition_ptr + p)
    logit = tl.where(seen, tl.where(logit > 0, logit / repetition, logit * repetition), logit)
    logit -= tl.load(frequency_ptr + p) * count.to(tl.float32) + tl.load(presence_ptr + p) * generated.to(tl.float32)
    tl.store(ptrs, logit.to(logits_ptr.dtype.element_ty), mask=mask)


@register("sampling", "triton", supports=Supports(dtypes=FLOATS), priority=10)
def apply_penalties(
    logits: torch.Tensor,
    rows: torch.Tensor,
    counts: torch.Tensor,
    prompt_mask: torch.Tensor | None,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    repetition: torch.Tensor,
) -> None:
    """Penalize logits [num_rows, vocab] in place at rows [P] (int64): counts [P, vocab] int32 of the
    generated tokens, prompt_mask [P, vocab] bool (None: no prompt tokens count), frequency,
    presence and repetition [P] float32 (module docstring)."""
    num, vocab = counts.shape
    if num == 0:
        return
    assert logits.stride(-1) == 1 and counts.is_contiguous() and logits.shape[-1] == vocab
    prompt = prompt_mask.view(torch.uint8) if prompt_mask is not None else counts
    block = min(4096, triton.next_power_of_2(vocab))
    _penalties_kernel[(num, triton.cdiv(vocab, block))](
        logits, logits.stride(0), rows, counts, counts.stride(0), prompt, prompt.stride(0),
        frequency, presence, repetition, vocab, HAS_PROMPT=prompt_mask is not None, BLOCK=block,
    )  # fmt: skip


@triton.jit
def _bitmask_kernel(logits_ptr, stride_logits, rows_ptr, mask_ptr, stride_mask, vocab, BLOCK: tl.constexpr):
    p = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < vocab
    row = tl.load(rows_ptr + p)
    words = tl.load(mask_ptr + p * stride_mask + cols // 32, mask=inside, other=0)
    allowed = ((words >> (cols % 32)) & 1) != 0
    tl.store(logits_ptr + row * stride_logits + cols, float("-inf"), mask=inside & ~allowed)


@register("sampling", "triton")
def apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set logits [num_rows, vocab] to -inf, in place, at rows [P] (int64) wherever bit t % 32 of word
    t // 32 of bitmask [P, ceil(vocab / 32)] (int32, a structured output's allowed tokens) is 0."""
    num = rows.shape[0]
    vocab = logits.shape[-1]
    if num == 0:
        return
    assert logits.stride(-1) == 1 and bitmask.is_contiguous() and bitmask.shape[-1] * 32 >= vocab
    block = min(4096, triton.next_power_of_2(vocab))
    _bitmask_kernel[(num, triton.cdiv(vocab, block))](logits, logits.stride(0), rows, bitmask, bitmask.stride(0), vocab,
                                                        BLOCK=block)  # fmt: skip
