"""Presence, frequency and repetition penalties on some rows of the logits, in place: the `sampling`
op's `apply_penalties` entry (kernels/reference.py holds its torch reference).

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
