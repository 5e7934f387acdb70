"""Sampling on the device: log-softmax, the top-k / top-p / min-p mask, and one draw per row.

Every kernel gives a program BLOCK_ROWS rows (1 on a GPU, many under the interpreter) and loops
over the vocabulary in chunks, so any vocabulary size fits in registers. Passes over the
vocabulary accumulate per lane ([BLOCK_ROWS, BLOCK_V]) and reduce once at the end, so the loop
body has no cross-warp reduction.

No sort: the filters become one threshold per row on the raw logits x (a token survives iff
x >= threshold; dividing by a positive temperature keeps the order, so the survivors are those of
s = x / temperature). The threshold is an exact logit value, so ties are kept together as in
`reference.sampling_mask`:
  top_k  the k-th largest x: the largest threshold with count(x >= thr) >= k;
  top_p  t survives iff the renormalised mass of tokens with x > x_t is below top_p: the smallest
         threshold with mass(x > thr) < top_p * mass(top-k survivors), mass exp((x - max x) / T);
  min_p  p_t >= min_p * max p  <=>  x_t >= max x + T * log(min_p): the row maximum suffices.
top-k and top-p are found among a few candidates copied to a scratch buffer (sampling_candidates.py,
about four passes over the vocabulary) and drawn from there; rows whose survivors do not fit it use
full-vocabulary searches (sampling_search.py, up to 14 passes each). Which rows use which filter is
read on the device; a program skips the passes that none of its rows needs, so launches need no
host sync.
Sampling is Gumbel-max: argmax over survivors of x + T * Gumbel noise (= argmax of x / T + noise),
the noise drawn by Philox from (row seed, token id), so a seed gives the same token whichever
batch the row is in.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

from tritonllm import platform  # isort: skip  (on CPU it switches on the interpreter before triton loads)

import torch
import triton
import triton.language as tl

from tritonllm.kernels.launch import DEFAULT_NUM_STAGES, Launcher, aligned, arrival_counters, int_spec, pdl_wait
from tritonllm.kernels.registry import FLOATS, Supports, register
from tritonllm.kernels.sampling_candidates import (
    CANDIDATE_PIVOTS,
    candidate_threshold,
    draw_candidates,
    load_candidates,
)
from tritonllm.kernels.sampling_search import (
    _NUM_PIVOTS,
    _any,
    _gumbel,
    _load_logits,
    _row_max_min,
    _searched_threshold,
)


@triton.jit
def _survival_threshold(logits_ptr, cand_x_ptr, cand_id_ptr, rows, row_offs, row_mask, vocab, temperature, top_k,
                        use_top_k, top_p, use_top_p, min_p, use_min_p, KEY_BITS: tl.constexpr,
                        SEARCH_STEPS: tl.constexpr, CANDIDATE_STEPS: tl.constexpr, COMPACT: tl.constexpr,
                        BLOCK_ROWS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_W: tl.constexpr):  # fmt: skip
    """Per row, the smallest logit that survives top-k, top-p and min-p (-inf: every token does),
    whether its survivors are all among its candidates in the scratch, and how many those are."""
    threshold = tl.full([BLOCK_ROWS], float("-inf"), tl.float32)
    from_candidates = tl.zeros([BLOCK_ROWS], tl.int1)
    num_candidates = tl.zeros([BLOCK_ROWS], tl.int32)
    if _any(use_top_k | use_top_p | use_min_p):
        row_max, row_min, finite_min = _row_max_min(logits_ptr, row_offs, row_mask, vocab, BLOCK_ROWS, BLOCK_V)
        thr_kp = row_min
        if _any(use_top_k | use_top_p):
            from_candidates, found, num_candidates = candidate_threshold(
                logits_ptr, cand_x_ptr, cand_id_ptr, rows, row_offs, row_mask, vocab, temperature, top_k, use_top_k,
                top_p, use_top_p, row_max, finite_min, KEY_BITS, CANDIDATE_STEPS, COMPACT, BLOCK_ROWS, BLOCK_V,
                BLOCK_W,
            )  # fmt: skip
            thr_kp = tl.where(from_candidates, found, row_min)
            searched = (use_top_k | use_top_p) & ~from_candidates
            if _any(searched):
                found = _searched_threshold(
                    logits_ptr, row_offs, row_mask, vocab, temperature, top_k, use_top_k & searched, top_p,
                    use_top_p & searched, row_max, row_min, KEY_BITS, SEARCH_STEPS, BLOCK_ROWS, BLOCK_V,
                )  # fmt: skip
                thr_kp = tl.where(searched, found, thr_kp)
        thr_min_p = row_max + temperature * tl.log(tl.where(use_min_p, min_p, 1.0))
        threshold = tl.where(use_min_p, tl.maximum(thr_kp, thr_min_p), thr_kp)
    return threshold, from_candidates, num_candidates


@triton.jit
def _gumbel_noise(seeds, start, BLOCK_ROWS: tl.constexpr, BLOCK_V: tl.constexpr):
    """Gumbel noise for tokens start .. start + BLOCK_V of each row. Token t takes output t % 4 of
    Philox(seed, t // 4): one Philox call serves four tokens."""
    quads = start // 4 + tl.arange(0, BLOCK_V // 4)[None, :] + tl.zeros([BLOCK_ROWS, BLOCK_V // 4], tl.int32)
    seeds_2d = seeds[:, None] + tl.zeros([BLOCK_ROWS, BLOCK_V // 4], tl.int64)
    u0, u1, u2, u3 = tl.rand4x(seeds_2d, quads)
    return _gumbel(tl.reshape(tl.join(tl.join(u0, u2), tl.join(u1, u3)), [BLOCK_ROWS, BLOCK_V]))  # u0 u1 u2 u3 u0 ...


@triton.jit
def _load_row_params(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, rows, row_mask, vocab):
    """Per-row parameters and which filters each row uses (top_k <= 0 or >= vocab, top_p >= 1 and
    min_p <= 0 are off)."""
    temperature = tl.load(temperature_ptr + rows, mask=row_mask, other=1.0).to(tl.float32)
    top_k = tl.load(top_k_ptr + rows, mask=row_mask, other=0).to(tl.int32)
    top_p = tl.load(top_p_ptr + rows, mask=row_mask, other=1.0).to(tl.float32)
    min_p = tl.load(min_p_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    return temperature, top_k, (top_k > 0) & (top_k < vocab), top_p, top_p < 1.0, min_p, min_p > 0.0


@triton.jit
def _sampling_mask_kernel(
    logits_ptr,  # [num_rows, vocab], rows row_stride apart, any float dtype
    mask_ptr,  # [num_rows, vocab] bool, contiguous
    temperature_ptr,  # [num_rows] float; <= 0 counts as 1
    top_k_ptr,  # [num_rows] int
    top_p_ptr,  # [num_rows] float
    min_p_ptr,  # [num_rows] float
    cand_x_ptr,  # [num_rows, COMPACT] float32 scratch: candidate values
    cand_id_ptr,  # [num_rows, COMPACT] int32 scratch: candidate token ids
    num_rows,
    vocab,
    row_stride,
    KEY_BITS: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
    CANDIDATE_STEPS: tl.constexpr,
    COMPACT: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_W: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = rows < num_rows
    temperature, top_k, use_top_k, top_p, use_top_p, min_p, use_min_p = _load_row_params(
        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, rows, row_mask, vocab
    )
    temperature = tl.where(temperature > 0, temperature, 1.0)
    row_offs = rows.to(tl.int64) * row_stride
    threshold, _, _ = _survival_threshold(
        logits_ptr, cand_x_ptr, cand_id_ptr, rows, row_offs, row_mask, vocab, temperature, top_k, use_top_k, top_p,
        use_top_p, min_p, use_min_p, KEY_BITS, SEARCH_STEPS, CANDIDATE_STEPS, COMPACT, BLOCK_ROWS, BLOCK_V, BLOCK_W,
    )  # fmt: skip
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x, valid = _load_logits(logits_ptr, row_offs, row_mask, cols, vocab)
        keep = x >= threshold[:, None]
        tl.store(mask_ptr + (rows.to(tl.int64) * vocab)[:, None] + cols[None, :], keep, mask=valid)


@triton.jit
def _draw_range(logits_ptr, row_offs, row_mask, lo, hi, vocab, threshold, sampled, temperature, seeds,
                BLOCK_ROWS: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Per row, over tokens lo .. hi (lo a multiple of BLOCK_V; hi one too, or the vocabulary's end) with
    x >= threshold: the best score, x (greedy rows) or x + T * Gumbel noise, and its first token on ties."""
    any_sampled = _any(sampled & row_mask)
    noise_scale = tl.where(sampled, temperature, 0.0)[:, None]  # greedy rows: no noise
    threshold_2d = threshold[:, None]
    lane_best = tl.full([BLOCK_ROWS, BLOCK_V], float("-inf"), tl.float32)
    lane_token = tl.zeros([BLOCK_ROWS, BLOCK_V], tl.int32)
    for start in range(lo, hi, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x, valid = _load_logits(logits_ptr, row_offs, row_mask, cols, vocab)
        score = x
        if any_sampled:
            score = x + noise_scale * _gumbel_noise(seeds, start, BLOCK_ROWS, BLOCK_V)
        score = tl.where(valid & (x >= threshold_2d), score, float("-inf"))
        # strictly better only: a lane keeps its earliest best token, as argmax keeps the first
        better = score > lane_best
        lane_token = tl.where(better, cols[None, :], lane_token)
        lane_best = tl.where(better, score, lane_best)
    best = tl.max(lane_best, axis=1)
    return best, tl.min(tl.where(lane_best == best[:, None], lane_token, vocab), axis=1)


@triton.jit
def _sample_rows(logits_ptr, temperature, top_k, use_top_k, top_p, use_top_p, min_p, use_min_p, seeds, cand_x_ptr,
                 cand_id_ptr, rows, row_offs, row_mask, vocab, KEY_BITS: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                 CANDIDATE_STEPS: tl.constexpr, COMPACT: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                 BLOCK_V: tl.constexpr, BLOCK_W: tl.constexpr):  # fmt: skip
    """Each row's token (int32; vocab where none survives): greedy where temperature <= 0, else a Gumbel-max
    draw over the tokens that survive the row's filters."""
    sampled = temperature > 0
    temperature = tl.where(sampled, temperature, 1.0)
    threshold, from_candidates, num_candidates = _survival_threshold(
        logits_ptr, cand_x_ptr, cand_id_ptr, rows, row_offs, row_mask, vocab, temperature, top_k, use_top_k & sampled,
        top_p, use_top_p & sampled, min_p, use_min_p & sampled, KEY_BITS, SEARCH_STEPS, CANDIDATE_STEPS, COMPACT,
        BLOCK_ROWS, BLOCK_V, BLOCK_W,
    )  # fmt: skip
    token = tl.zeros([BLOCK_ROWS], tl.int32)
    if _any(from_candidates):
        x, ids, valid = load_candidates(cand_x_ptr, cand_id_ptr, rows, num_candidates, COMPACT)
        survives = valid & from_candidates[:, None] & (x >= threshold[:, None])
        token = draw_candidates(x, ids, survives, seeds, temperature, vocab)
    if _any(row_mask & ~from_candidates):
        _, drawn = _draw_range(logits_ptr, row_offs, row_mask, 0, vocab, vocab, threshold, sampled, temperature, seeds,
                               BLOCK_ROWS, BLOCK_V)  # fmt: skip
        token = tl.where(from_candidates, token, drawn)
    return token


@triton.jit
def _sample_kernel(
    logits_ptr,  # [num_rows, vocab], rows row_stride apart, any float dtype
    out_ptr,  # [num_rows] int64: the drawn token ids
    temperature_ptr,  # [num_rows] float; <= 0: greedy (argmax, first index on ties, no filter)
    top_k_ptr,  # [num_rows] int
    top_p_ptr,  # [num_rows] float
    min_p_ptr,  # [num_rows] float
    seeds_ptr,  # [num_rows] int64: Philox seed of each row for this step
    cand_x_ptr,  # [num_rows, COMPACT] float32 scratch: candidate values
    cand_id_ptr,  # [num_rows, COMPACT] int32 scratch: candidate token ids
    num_rows,
    vocab,
    row_stride,
    KEY_BITS: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
    CANDIDATE_STEPS: tl.constexpr,
    COMPACT: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_W: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = rows < num_rows
    temperature, top_k, use_top_k, top_p, use_top_p, min_p, use_min_p = _load_row_params(
        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, rows, row_mask, vocab
    )
    seeds = tl.load(seeds_ptr + rows, mask=row_mask, other=0).to(tl.int64)
    token = _sample_rows(
        logits_ptr, temperature, top_k, use_top_k, top_p, use_top_p, min_p, use_min_p, seeds, cand_x_ptr, cand_id_ptr,
        rows, rows.to(tl.int64) * row_stride, row_mask, vocab, KEY_BITS, SEARCH_STEPS, CANDIDATE_STEPS, COMPACT,
        BLOCK_ROWS, BLOCK_V, BLOCK_W,
    )  # fmt: skip
    tl.store(out_ptr + rows, tl.where(token < vocab, token, 0).to(tl.int64), mask=row_mask)


@triton.jit
def _sample_split_kernel(
    logits_ptr, out_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seeds_ptr, cand_x_ptr, cand_id_ptr,
    counter_ptr,  # [num_rows] int32 arrival counters, zero before and after the launch
    num_rows, vocab, row_stride,
    span,  # tokens a split scans: a multiple of BLOCK_V
    KEY_BITS: tl.constexpr, SEARCH_STEPS: tl.constexpr, CANDIDATE_STEPS: tl.constexpr, COMPACT: tl.constexpr,
    SPLITS: tl.constexpr,  # a power of two >= the grid's splits (program axis 1), <= COMPACT
    BLOCK_V: tl.constexpr, BLOCK_W: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """`_sample_kernel` for few rows: program (row, split). A row without filters (greedy, or temperature
    alone) has each split draw over its `span` of the vocabulary into the row's scratch slot, and the last
    split to arrive takes the best (the first token on ties: the same token as one program over the whole
    row, whose noise depends only on the token id); a filtered row is sampled by its split 0 alone."""
    pdl_wait(PDL)
    rows = tl.program_id(0) + tl.arange(0, 1)
    split = tl.program_id(1)
    row_mask = rows < num_rows
    temperature, top_k, use_top_k, top_p, use_top_p, min_p, use_min_p = _load_row_params(
        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, rows, row_mask, vocab
    )
    seeds = tl.load(seeds_ptr + rows, mask=row_mask, other=0).to(tl.int64)
    row_offs = rows.to(tl.int64) * row_stride
    sampled = temperature > 0
    filtered = _any(sampled & (use_top_k | use_top_p | use_min_p))
    if filtered:
        if split == 0:
            token = _sample_rows(
                logits_ptr, temperature, top_k, use_top_k, top_p, use_top_p, min_p, use_min_p, seeds, cand_x_ptr,
                cand_id_ptr, rows, row_offs, row_mask, vocab, KEY_BITS, SEARCH_STEPS, CANDIDATE_STEPS, COMPACT, 1,
                BLOCK_V, BLOCK_W,
            )  # fmt: skip
            tl.store(out_ptr + rows, tl.where(token < vocab, token, 0).to(tl.int64), mask=row_mask)
    else:
        lo = split * span
        best, token = _draw_range(logits_ptr, row_offs, row_mask, lo, tl.minimum(lo + span, vocab), vocab,
                                  tl.full([1], float("-inf"), tl.float32), sampled,
                                  tl.where(sampled, temperature, 1.0), seeds, 1, BLOCK_V)  # fmt: skip
        slot = rows.to(tl.int64) * COMPACT + split
        tl.store(cand_x_ptr + slot, best, mask=row_mask)
        tl.store(cand_id_ptr + slot, token, mask=row_mask)
    tl.debug_barrier()  # every thread's stores before the (releasing) arrival
    if tl.atomic_add(counter_ptr + tl.program_id(0), 1, sem="acq_rel", scope="gpu") == tl.num_programs(1) - 1:
        if not filtered:
            slots = tl.arange(0, SPLITS)
            mine = row_mask[:, None] & (slots < tl.num_programs(1))[None, :]
            offs = (rows.to(tl.int64) * COMPACT)[:, None] + slots[None, :]
            x = tl.load(cand_x_ptr + offs, mask=mine, other=float("-inf"), cache_modifier=".cg")
            ids = tl.load(cand_id_ptr + offs, mask=mine, other=vocab, cache_modifier=".cg")
            best = tl.max(x, axis=1)
            token = tl.min(tl.where(x == best[:, None], ids, vocab), axis=1)
            tl.store(out_ptr + rows, tl.where(token < vocab, token, 0).to(tl.int64), mask=row_mask)
        tl.atomic_xchg(counter_ptr + tl.program_id(0), 0, sem="relaxed", scope="gpu")  # ready for the next launch


@triton.jit
def _log_softmax_kernel(
    logits_ptr,  # [num_rows, vocab], rows row_stride apart, any float dtype
    out_ptr,  # [num_rows, vocab] float32, contiguous
    num_rows,
    vocab,
    row_stride,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_wait(PDL)
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = rows < num_rows
    in_offs = (rows.to(tl.int64) * row_stride)[:, None]
    out_offs = (rows.to(tl.int64) * vocab)[:, None]
    # online max and sum of exp in one pass; a running max of -inf (all -inf so far) is shifted to
    # 0 so that -inf - -inf never makes a NaN
    row_max = tl.full([BLOCK_ROWS], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_ROWS], tl.float32)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        valid = row_mask[:, None] & (cols < vocab)[None, :]
        x = tl.load(logits_ptr + in_offs + cols[None, :], mask=valid, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(row_max, tl.max(x, axis=1))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        row_sum = row_sum * tl.exp(row_max - shift) + tl.sum(tl.exp(x - shift[:, None]), axis=1)
        row_max = new_max
    log_norm = row_max + tl.log(tl.where(row_mask, row_sum, 1.0))  # rows past num_rows: no log(0)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        valid = row_mask[:, None] & (cols < vocab)[None, :]
        x = tl.load(logits_ptr + in_offs + cols[None, :], mask=valid, other=0.0).to(tl.float32)
        tl.store(out_ptr + out_offs + cols[None, :], x - log_norm[:, None], mask=valid)


_SAMPLING_MASK = Launcher(_sampling_mask_kernel)
_SAMPLE = Launcher(_sample_kernel)
_SAMPLE_SPLIT = Launcher(_sample_split_kernel)
# Batches of up to this many rows sample with each row's vocabulary split over several programs
# (_sample_split_kernel) on a GPU: one program a row reads a 201,088-token row in 24.6 us at batch 1 (gpt-oss-20b
# on an H200, session 33's step timeline: 1.3% of the step). Session 36 on an H200: gpt-oss-20b batch 1 565.7 ->
# 571.7 tok/s with it (TRITONLLM_SAMPLE_SPLIT_ROWS; 0: off). SPLIT_PROGRAMS: programs a launch aims at,
# SPLIT_BLOCK_V: a split's chunk.
SPLIT_ROWS = int(os.environ.get("TRITONLLM_SAMPLE_SPLIT_ROWS", "8"))
SPLIT_PROGRAMS = 256
SPLIT_BLOCK_V = 4096
_LOG_SOFTMAX = Launcher(_log_softmax_kernel)


def _launch_config(num_rows: int, vocab: int) -> tuple[int, int, int]:
    """(BLOCK_ROWS, BLOCK_V, num_warps). GPU: one row per program, and long chunks with many warps,
    since a row's passes are bound by memory latency (measured on an H200 at vocab 151936).
    Interpreter: a few programs of many rows, since each program and loop step costs milliseconds."""
    if platform.is_interpreter():
        block_v = max(16, min(triton.next_power_of_2(vocab), 4096))
        return min(triton.next_power_of_2(num_rows), max(1, 32768 // block_v)), block_v, 1
    block_v = max(16, min(triton.next_power_of_2(vocab), 8192))
    return 1, block_v, max(1, min(16, block_v // 512))


class _Filters(NamedTuple):
    """The filter kernels' constexprs and scratch size for one launch."""

    constexprs: dict[str, int]
    compact: int
    num_warps: int
    grid: tuple[int]


@functools.cache
def _search_steps(dtype: torch.dtype) -> tuple[int, int, int]:
    """(KEY_BITS, SEARCH_STEPS, CANDIDATE_STEPS) for logits of dtype. KEY_BITS: width of the dtype;
    the steps pin a threshold among 2^KEY_BITS + 1 keys exactly, a full-vocabulary step keeping one of
    _NUM_PIVOTS + 1 parts, a step among candidates one of CANDIDATE_PIVOTS + 1."""
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"logits must be float32, float16 or bfloat16, got {dtype}")
    key_bits = 8 * dtype.itemsize

    def steps(parts: int) -> int:
        span, count = 2**key_bits + 1, 0
        while span > 1:
            span, count = -(-span // parts), count + 1
        return count

    return key_bits, steps(_NUM_PIVOTS + 1), steps(CANDIDATE_PIVOTS.value + 1)


def _filters(num_rows: int, vocab: int, dtype: torch.dtype) -> _Filters:
    """Launch set-up of the mask and sample kernels. Candidate scratch: 1024 slots a row on a GPU
    (a top-k of up to 1024, or top-p survivors of a peaked row), 128 under the interpreter, so that
    its tests at small vocabularies reach both the candidate path and the fallback."""
    block_rows, block_v, num_warps = _launch_config(num_rows, vocab)
    compact = 128 if platform.is_interpreter() else 1024
    # window passes count 8 values per token: shorter chunks keep their counters in registers
    block_w = block_v if platform.is_interpreter() else max(16, block_v // 4)
    key_bits, search_steps, candidate_steps = _search_steps(dtype)
    constexprs = dict(
        KEY_BITS=key_bits, SEARCH_STEPS=search_steps, CANDIDATE_STEPS=candidate_steps, COMPACT=compact,
        BLOCK_ROWS=block_rows, BLOCK_V=block_v, BLOCK_W=block_w,
    )  # fmt: skip
    return _Filters(constexprs, compact, num_warps, (triton.cdiv(num_rows, block_rows),))


def _scratch(num_rows: int, compact: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.empty((num_rows, compact), dtype=torch.float32, device=device),
        torch.empty((num_rows, compact), dtype=torch.int32, device=device),
    )


def _rows(logits: torch.Tensor) -> torch.Tensor:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [num_rows, vocab], got shape {tuple(logits.shape)}")
    return logits if logits.stride(-1) == 1 else logits.contiguous()


@register("sampling", "triton")
def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [num_rows, vocab] -> float32 log-probabilities [num_rows, vocab]."""
    logits = _rows(logits)
    num_rows, vocab = logits.shape
    out = torch.empty((num_rows, vocab), dtype=torch.float32, device=logits.device)
    if out.numel() == 0:
        return out
    block_rows, block_v, num_warps = _launch_config(num_rows, vocab)
    row_stride = logits.stride(0)
    device_index = logits.device.index or 0
    # out is float32; vocab and the row stride are fixed by the model: raw values
    key = (
        logits.dtype, aligned(logits, out), int_spec(num_rows), vocab, row_stride,
    )  # fmt: skip
    _LOG_SOFTMAX(
        key, (triton.cdiv(num_rows, block_rows),), (logits, out, num_rows, vocab, row_stride),
        dict(BLOCK_ROWS=block_rows, BLOCK_V=block_v), num_warps=num_warps, num_stages=DEFAULT_NUM_STAGES,
        device_index=device_index,
    )  # fmt: skip
    return out


def sampling_mask(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """Which tokens each row may sample, bool [num_rows, vocab]: `reference.sampling_mask`,
    computed with the thresholds `sample` uses."""
    logits = _rows(logits)
    num_rows, vocab = logits.shape
    mask = torch.empty((num_rows, vocab), dtype=torch.bool, device=logits.device)
    if mask.numel() == 0:
        return mask
    f = _filters(num_rows, vocab, logits.dtype)
    cand_x, cand_id = _scratch(num_rows, f.compact, logits.device)
    row_stride = logits.stride(0)
    args = (logits, mask, temperature, top_k, top_p, min_p, cand_x, cand_id, num_rows, vocab, row_stride)
    # mask is bool, the scratch float32/int32; vocab and the row stride are fixed by the model: raw values
    key = (
        logits.dtype, temperature.dtype, top_k.dtype, top_p.dtype, min_p.dtype,
        aligned(logits, mask, temperature, top_k, top_p, min_p), int_spec(num_rows), vocab, row_stride,
    )  # fmt: skip
    _SAMPLING_MASK(
        key, f.grid, args, f.constexprs, num_warps=f.num_warps, num_stages=DEFAULT_NUM_STAGES,
        device_index=logits.device.index or 0,
    )  # fmt: skip
    return mask


@register("sampling", "triton", supports=Supports(dtypes=FLOATS), priority=10)
def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
) -> torch.Tensor:
    """One token per row, int64 [num_rows]: greedy (first argmax) where temperature <= 0, else a
    Gumbel-max draw from softmax(logits / temperature) restricted to `sampling_mask`. The draw
    depends only on the row's logits, parameters and seed, not on the rest of the batch."""
    splits = None
    if 0 < logits.shape[0] <= SPLIT_ROWS and not platform.is_interpreter():
        splits = max(1, SPLIT_PROGRAMS // logits.shape[0])  # sample_rows keeps them within the vocabulary's chunks
    return sample_rows(logits, temperature, top_k, top_p, min_p, seeds, splits)


def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    splits: int | None = None,
    block_v: int | None = None,
) -> torch.Tensor:
    """`sample` with its launch chosen: one program a row (splits None), or each row over `splits` programs
    (_sample_split_kernel, up to COMPACT; falls back to one a row where no arrival counters exist), each
    scanning chunks of `block_v` tokens (default: SPLIT_BLOCK_V on a GPU)."""
    logits = _rows(logits)
    num_rows, vocab = logits.shape
    out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    f = _filters(num_rows, vocab, logits.dtype)
    cand_x, cand_id = _scratch(num_rows, f.compact, logits.device)
    row_stride = logits.stride(0)
    operands = (logits, out, temperature, top_k, top_p, min_p, seeds, cand_x, cand_id)
    # out is int64, the scratch float32/int32; vocab and the row stride are fixed by the model: raw values
    key = (
        logits.dtype, temperature.dtype, top_k.dtype, top_p.dtype, min_p.dtype, seeds.dtype,
        aligned(logits, out, temperature, top_k, top_p, min_p, seeds), int_spec(num_rows), vocab, row_stride,
    )  # fmt: skip
    counters = arrival_counters(logits.device) if splits else None
    if counters is not None and num_rows <= counters.numel():
        block_v = block_v or (f.constexprs["BLOCK_V"] if platform.is_interpreter() else SPLIT_BLOCK_V)
        splits = max(1, min(splits, f.compact, triton.cdiv(vocab, block_v)))
        span = triton.cdiv(triton.cdiv(vocab, block_v), splits) * block_v
        splits = triton.cdiv(vocab, span)  # no split past the vocabulary
        c = f.constexprs
        constexprs = dict(
            KEY_BITS=c["KEY_BITS"], SEARCH_STEPS=c["SEARCH_STEPS"], CANDIDATE_STEPS=c["CANDIDATE_STEPS"],
            COMPACT=f.compact, SPLITS=triton.next_power_of_2(splits), BLOCK_V=block_v,
            BLOCK_W=block_v if platform.is_interpreter() else max(16, block_v // 4),
        )  # fmt: skip
        _SAMPLE_SPLIT(
            (*key, span), (num_rows, splits), (*operands, counters, num_rows, vocab, row_stride, span), constexprs,
            num_warps=1 if platform.is_interpreter() else 8, num_stages=DEFAULT_NUM_STAGES,
            device_index=logits.device.index or 0,
        )  # fmt: skip
        return out
    _SAMPLE(
        key, f.grid, (*operands, num_rows, vocab, row_stride), f.constexprs, num_warps=f.num_warps,
        num_stages=DEFAULT_NUM_STAGES, device_index=logits.device.index or 0,
    )  # fmt: skip
    return out
