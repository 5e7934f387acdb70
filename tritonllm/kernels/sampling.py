"""Sampling on the device: log-softmax, the top-k / top-p / min-p mask, and one draw per row.

Every kernel gives a program BLOCK_ROWS rows (1 on a GPU, many under the interpreter) and loops
over the vocabulary in chunks of BLOCK_V, so any vocabulary size fits in registers.

No sort: each filter becomes a threshold on the scaled logits s = logits / temperature, found by
binary search over the 32-bit patterns of float32 (an order-preserving integer key), each step a
pass over the vocabulary. After 32 steps the threshold is exact, so ties are kept together as in
`reference.sampling_mask`:
  top_k  keeps s >= the k-th largest s: the largest threshold with count(s >= thr) >= k;
  top_p  keeps t iff the renormalised mass of tokens with s > s_t is below top_p: the smallest
         threshold with mass(s > thr) < top_p * mass(top-k kept);
  min_p  keeps exp(s - max s) >= min_p, which needs only the row maximum.
Sampling is Gumbel-max: argmax over kept tokens of s + Gumbel noise, the noise drawn by Philox
from (row seed, token id), so a seed gives the same token whichever batch the row is in.
"""

from __future__ import annotations

from tritonllm import platform  # isort: skip  (on CPU it switches on the interpreter before triton loads)

import torch
import triton
import triton.language as tl

_KEY_BITS = tl.constexpr(32)  # binary-search steps that pin a float32 threshold exactly


@triton.jit
def _float_to_key(x):
    """float32 -> int64 key with the same order (negative floats' magnitude bits flipped)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)


@triton.jit
def _key_to_float(key):
    key = key.to(tl.int32)
    return tl.where(key >= 0, key, key ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _load_scaled(logits_ptr, row_offs, row_mask, temperature, cols, vocab):
    """s = logits / temperature in float32 for one [BLOCK_ROWS, BLOCK_V] chunk; -inf off the rows.
    Correctly rounded division, so s matches torch's bit for bit and top-k thresholds agree."""
    valid = row_mask[:, None] & (cols < vocab)[None, :]
    x = tl.load(logits_ptr + row_offs[:, None] + cols[None, :], mask=valid, other=float("-inf"))
    return tl.math.div_rn(x.to(tl.float32), temperature[:, None]), valid


@triton.jit
def _row_max_min(logits_ptr, row_offs, row_mask, temperature, vocab, BLOCK_ROWS, BLOCK_V):
    row_max = tl.full([BLOCK_ROWS], float("-inf"), tl.float32)
    row_min = tl.full([BLOCK_ROWS], float("inf"), tl.float32)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        s, valid = _load_scaled(logits_ptr, row_offs, row_mask, temperature, cols, vocab)
        row_max = tl.maximum(row_max, tl.max(s, axis=1))
        row_min = tl.minimum(row_min, tl.min(tl.where(valid, s, float("inf")), axis=1))
    # rows past num_rows get finite stats, so their (unstored) lanes make no NaN from -inf - -inf
    return tl.where(row_mask, row_max, 0.0), tl.where(row_mask, row_min, 0.0)


@triton.jit
def _top_k_threshold(logits_ptr, row_offs, row_mask, temperature, vocab, k, row_max, row_min,
                     BLOCK_ROWS, BLOCK_V):  # fmt: skip
    """The k-th largest s of each row: the largest key with count(s >= key) >= k."""
    lo = _float_to_key(row_min)  # count(s >= min) = vocab >= k: always feasible
    hi = _float_to_key(row_max) + 1  # count(s > max) = 0 < k: never feasible
    for _ in range(_KEY_BITS):
        active = hi - lo > 1
        mid = lo + (hi - lo) // 2
        thr = _key_to_float(mid)
        count = tl.zeros([BLOCK_ROWS], tl.int32)
        for start in range(0, vocab, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            s, valid = _load_scaled(logits_ptr, row_offs, row_mask, temperature, cols, vocab)
            count += tl.sum((valid & (s >= thr[:, None])).to(tl.int32), axis=1)
        feasible = count >= k
        lo = tl.where(active & feasible, mid, lo)
        hi = tl.where(active & ~feasible, mid, hi)
    return _key_to_float(lo)


@triton.jit
def _top_p_threshold(logits_ptr, row_offs, row_mask, temperature, vocab, top_p, row_max, thr_k,
                     BLOCK_ROWS, BLOCK_V):  # fmt: skip
    """The smallest key with mass(thr_k <= s, s > key) < top_p * mass(s >= thr_k); masses are
    exp(s - row_max), the softmax numerators."""
    kept_mass = tl.zeros([BLOCK_ROWS], tl.float32)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        s, valid = _load_scaled(logits_ptr, row_offs, row_mask, temperature, cols, vocab)
        e = tl.exp(s - row_max[:, None])
        kept_mass += tl.sum(tl.where(valid & (s >= thr_k[:, None]), e, 0.0), axis=1)
    mass_limit = top_p * kept_mass
    lo = _float_to_key(thr_k) - 1  # below thr_k all kept mass lies above: never feasible
    hi = _float_to_key(row_max)  # no mass above the maximum: feasible for top_p > 0
    for _ in range(_KEY_BITS):
        active = hi - lo > 1
        mid = lo + (hi - lo) // 2
        thr = _key_to_float(mid)
        mass = tl.zeros([BLOCK_ROWS], tl.float32)
        for start in range(0, vocab, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            s, valid = _load_scaled(logits_ptr, row_offs, row_mask, temperature, cols, vocab)
            above = valid & (s >= thr_k[:, None]) & (s > thr[:, None])
            mass += tl.sum(tl.where(above, tl.exp(s - row_max[:, None]), 0.0), axis=1)
        feasible = mass < mass_limit
        hi = tl.where(active & feasible, mid, hi)
        lo = tl.where(active & ~feasible, mid, lo)
    return _key_to_float(hi)


@triton.jit
def _filter_thresholds(logits_ptr, row_offs, row_mask, temperature, vocab, top_k, use_top_k, top_p,
                       use_top_p, HAS_TOP_K, HAS_TOP_P, BLOCK_ROWS, BLOCK_V):  # fmt: skip
    """(row_max, thr_k, thr_p) per row; a token survives top-k and top-p iff s >= both thresholds
    (-inf where a filter is off, for the row or for the whole launch)."""
    row_max, row_min = _row_max_min(logits_ptr, row_offs, row_mask, temperature, vocab, BLOCK_ROWS, BLOCK_V)
    thr_k = tl.full([BLOCK_ROWS], float("-inf"), tl.float32)
    thr_p = tl.full([BLOCK_ROWS], float("-inf"), tl.float32)
    if HAS_TOP_K:
        thr_k = _top_k_threshold(
            logits_ptr, row_offs, row_mask, temperature, vocab, top_k, row_max, row_min, BLOCK_ROWS, BLOCK_V
        )
        thr_k = tl.where(use_top_k, thr_k, float("-inf"))
    if HAS_TOP_P:
        thr_p = _top_p_threshold(
            logits_ptr, row_offs, row_mask, temperature, vocab, top_p, row_max, tl.maximum(thr_k, row_min),
            BLOCK_ROWS, BLOCK_V,
        )  # fmt: skip
        thr_p = tl.where(use_top_p, thr_p, float("-inf"))
    return row_max, thr_k, thr_p


@triton.jit
def _kept(s, valid, row_max, thr_k, thr_p, min_p, HAS_TOP_K, HAS_TOP_P, HAS_MIN_P):
    keep = valid
    if HAS_TOP_K:
        keep &= s >= thr_k[:, None]
    if HAS_TOP_P:
        keep &= s >= thr_p[:, None]
    if HAS_MIN_P:
        # p_t >= min_p * max p  <=>  exp(s_t - max s) >= min_p; min_p <= 0 keeps everything
        keep &= tl.exp(s - row_max[:, None]) >= min_p[:, None]
    return keep


@triton.jit
def _load_row_params(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, rows, row_mask, vocab):
    temperature = tl.load(temperature_ptr + rows, mask=row_mask, other=1.0).to(tl.float32)
    top_k = tl.load(top_k_ptr + rows, mask=row_mask, other=0).to(tl.int32)
    top_p = tl.load(top_p_ptr + rows, mask=row_mask, other=1.0).to(tl.float32)
    min_p = tl.load(min_p_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    use_top_k = (top_k > 0) & (top_k < vocab)
    use_top_p = top_p < 1.0
    return temperature, top_k, use_top_k, top_p, use_top_p, min_p


@triton.jit
def _sampling_mask_kernel(
    logits_ptr,  # [num_rows, vocab], rows row_stride apart, any float dtype
    mask_ptr,  # [num_rows, vocab] bool, contiguous
    temperature_ptr,  # [num_rows] float; <= 0 counts as 1
    top_k_ptr,  # [num_rows] int; <= 0 or >= vocab: off
    top_p_ptr,  # [num_rows] float; >= 1: off
    min_p_ptr,  # [num_rows] float; <= 0: off
    num_rows,
    vocab,
    row_stride,
    HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = rows < num_rows
    temperature, top_k, use_top_k, top_p, use_top_p, min_p = _load_row_params(
        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, rows, row_mask, vocab
    )
    temperature = tl.where(temperature > 0, temperature, 1.0)
    row_offs = rows.to(tl.int64) * row_stride
    row_max, thr_k, thr_p = _filter_thresholds(
        logits_ptr, row_offs, row_mask, temperature, vocab, top_k, use_top_k, top_p, use_top_p,
        HAS_TOP_K, HAS_TOP_P, BLOCK_ROWS, BLOCK_V,
    )  # fmt: skip
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        s, valid = _load_scaled(logits_ptr, row_offs, row_mask, temperature, cols, vocab)
        keep = _kept(s, valid, row_max, thr_k, thr_p, min_p, HAS_TOP_K, HAS_TOP_P, HAS_MIN_P)
        tl.store(mask_ptr + (rows.to(tl.int64) * vocab)[:, None] + cols[None, :], keep, mask=valid)


@triton.jit
def _sample_kernel(
    logits_ptr,  # [num_rows, vocab], rows row_stride apart, any float dtype
    out_ptr,  # [num_rows] int64: the drawn token ids
    temperature_ptr,  # [num_rows] float; <= 0: greedy (argmax, first index on ties, no filter)
    top_k_ptr,  # [num_rows] int; <= 0 or >= vocab: off
    top_p_ptr,  # [num_rows] float; >= 1: off
    min_p_ptr,  # [num_rows] float; <= 0: off
    seeds_ptr,  # [num_rows] int64: Philox seed of each row for this step
    num_rows,
    vocab,
    row_stride,
    ANY_SAMPLED: tl.constexpr,
    HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = rows < num_rows
    temperature, top_k, use_top_k, top_p, use_top_p, min_p = _load_row_params(
        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, rows, row_mask, vocab
    )
    sampled = temperature > 0
    temperature = tl.where(sampled, temperature, 1.0)
    min_p = tl.where(sampled, min_p, 0.0)
    row_offs = rows.to(tl.int64) * row_stride
    row_max = tl.zeros([BLOCK_ROWS], tl.float32)
    thr_k = tl.full([BLOCK_ROWS], float("-inf"), tl.float32)
    thr_p = tl.full([BLOCK_ROWS], float("-inf"), tl.float32)
    if HAS_TOP_K or HAS_TOP_P or HAS_MIN_P:
        row_max, thr_k, thr_p = _filter_thresholds(
            logits_ptr, row_offs, row_mask, temperature, vocab, top_k, use_top_k & sampled, top_p,
            use_top_p & sampled, HAS_TOP_K, HAS_TOP_P, BLOCK_ROWS, BLOCK_V,
        )  # fmt: skip
    seeds = tl.load(seeds_ptr + rows, mask=row_mask, other=0).to(tl.int64)
    seeds_2d = seeds[:, None] + tl.zeros([BLOCK_ROWS, BLOCK_V], tl.int64)
    best_score = tl.full([BLOCK_ROWS], float("-inf"), tl.float32)
    best_token = tl.zeros([BLOCK_ROWS], tl.int32)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        s, valid = _load_scaled(logits_ptr, row_offs, row_mask, temperature, cols, vocab)
        score = s
        if ANY_SAMPLED:
            # Gumbel noise -log(-log(u)); u = 0 (prob. 2^-31) is lifted so a kept token stays finite
            u = tl.rand(seeds_2d, cols[None, :] + tl.zeros([BLOCK_ROWS, BLOCK_V], tl.int32))
            gumbel = -tl.log(-tl.log(tl.maximum(u, 1.0e-30)))
            score = tl.where(sampled[:, None], s + gumbel, s)
        keep = _kept(s, valid, row_max, thr_k, thr_p, min_p, HAS_TOP_K, HAS_TOP_P, HAS_MIN_P)
        score = tl.where(keep, score, float("-inf"))
        chunk_best = tl.max(score, axis=1)
        chunk_token = tl.min(tl.where(score == chunk_best[:, None], cols[None, :], vocab), axis=1)
        # strictly better only: on ties the earlier chunk (smaller token id) wins, like argmax
        better = (chunk_best > best_score) & (chunk_token < vocab)
        best_token = tl.where(better, chunk_token, best_token)
        best_score = tl.where(better, chunk_best, best_score)
    tl.store(out_ptr + rows, best_token.to(tl.int64), mask=row_mask)


@triton.jit
def _log_softmax_kernel(
    logits_ptr,  # [num_rows, vocab], rows row_stride apart, any float dtype
    out_ptr,  # [num_rows, vocab] float32, contiguous
    num_rows,
    vocab,
    row_stride,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
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


def _launch_config(num_rows: int, vocab: int) -> tuple[int, int, int]:
    """(BLOCK_ROWS, BLOCK_V, num_warps): on a GPU one row per program, long chunks; under the
    interpreter a few programs of many rows, since each program and loop step costs milliseconds."""
    if platform.is_interpreter():
        block_v = min(triton.next_power_of_2(vocab), 4096)
        block_rows = min(triton.next_power_of_2(num_rows), max(1, 65536 // block_v))
        return block_rows, block_v, 1
    return 1, min(triton.next_power_of_2(vocab), 4096), 8


def _rows(logits: torch.Tensor) -> torch.Tensor:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [num_rows, vocab], got shape {tuple(logits.shape)}")
    return logits if logits.stride(-1) == 1 else logits.contiguous()


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [num_rows, vocab] -> float32 log-probabilities [num_rows, vocab]."""
    logits = _rows(logits)
    num_rows, vocab = logits.shape
    out = torch.empty((num_rows, vocab), dtype=torch.float32, device=logits.device)
    if out.numel() == 0:
        return out
    block_rows, block_v, num_warps = _launch_config(num_rows, vocab)
    _log_softmax_kernel[(triton.cdiv(num_rows, block_rows),)](
        logits, out, num_rows, vocab, logits.stride(0), BLOCK_ROWS=block_rows, BLOCK_V=block_v,
        num_warps=num_warps,
    )  # fmt: skip
    return out


def _filter_flags(
    vocab: int,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    greedy_rows_unfiltered: bool,
) -> list[bool]:
    """[any row sampled, any row uses top-k, top-p, min-p], with one host sync for all four."""
    sampled = temperature > 0
    uses = torch.stack([sampled, (top_k > 0) & (top_k < vocab), top_p < 1, min_p > 0])
    if greedy_rows_unfiltered:
        uses[1:] &= sampled
    return uses.any(dim=1).tolist()


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
    _, has_top_k, has_top_p, has_min_p = _filter_flags(vocab, temperature, top_k, top_p, min_p, False)
    block_rows, block_v, num_warps = _launch_config(num_rows, vocab)
    _sampling_mask_kernel[(triton.cdiv(num_rows, block_rows),)](
        logits, mask, temperature, top_k, top_p, min_p, num_rows, vocab, logits.stride(0),
        HAS_TOP_K=has_top_k, HAS_TOP_P=has_top_p, HAS_MIN_P=has_min_p, BLOCK_ROWS=block_rows,
        BLOCK_V=block_v, num_warps=num_warps,
    )  # fmt: skip
    return mask


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
    logits = _rows(logits)
    num_rows, vocab = logits.shape
    out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    any_sampled, has_top_k, has_top_p, has_min_p = _filter_flags(vocab, temperature, top_k, top_p, min_p, True)
    block_rows, block_v, num_warps = _launch_config(num_rows, vocab)
    _sample_kernel[(triton.cdiv(num_rows, block_rows),)](
        logits, out, temperature, top_k, top_p, min_p, seeds, num_rows, vocab, logits.stride(0),
        ANY_SAMPLED=any_sampled, HAS_TOP_K=has_top_k, HAS_TOP_P=has_top_p, HAS_MIN_P=has_min_p,
        BLOCK_ROWS=block_rows, BLOCK_V=block_v, num_warps=num_warps,
    )  # fmt: skip
    return out
