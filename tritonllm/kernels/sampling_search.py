"""Threshold searches over the whole vocabulary, and the helpers every sampling pass shares.

A filter's threshold is an exact logit value, searched over the bit patterns of the logits' dtype
(an order-preserving integer key): each step is a pass over the vocabulary that tries 4 keys and
keeps 1/5 of the range, so 7 steps pin a bfloat16/float16 value and 14 a float32 one. The sampler
uses these searches only for rows whose survivors do not fit its candidate buffer
(sampling_candidates.py); they need no scratch memory and handle any distribution.
"""

from __future__ import annotations

from tritonllm import platform  # noqa: F401  isort: skip  (on CPU it switches on the interpreter before triton loads)

import triton
import triton.language as tl

# keys tried per pass of a threshold search: a pass is bound by memory latency, so comparing with
# 4 keys costs little more than with 1 and each pass keeps 1/5 of the range instead of 1/2
_NUM_PIVOTS = 4


@triton.jit
def _float_to_key(x, KEY_BITS: tl.constexpr, DTYPE: tl.constexpr):
    """Logit values (float32 holding DTYPE values) -> int64 keys in the same order: the DTYPE bit
    pattern with the magnitude bits of negative values flipped."""
    if KEY_BITS == 16:
        bits = x.to(DTYPE).to(tl.int16, bitcast=True).to(tl.int32)
        key = tl.where(bits >= 0, bits, bits ^ 0x7FFF)
    else:
        bits = x.to(tl.int32, bitcast=True)
        key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return key.to(tl.int64)


@triton.jit
def _key_to_float(key, KEY_BITS: tl.constexpr, DTYPE: tl.constexpr):
    key = key.to(tl.int32)
    if KEY_BITS == 16:
        bits = tl.where(key >= 0, key, key ^ 0x7FFF).to(tl.int16)
        value = bits.to(DTYPE, bitcast=True).to(tl.float32)
    else:
        value = tl.where(key >= 0, key, key ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    return value


@triton.jit
def _load_logits(logits_ptr, row_offs, row_mask, cols, vocab):
    """One [BLOCK_ROWS, BLOCK_V] chunk of logits in float32, -inf off the rows and the vocabulary."""
    valid = row_mask[:, None] & (cols < vocab)[None, :]
    x = tl.load(logits_ptr + row_offs[:, None] + cols[None, :], mask=valid, other=float("-inf"))
    return x.to(tl.float32), valid


@triton.jit
def _load_for_search(logits_ptr, row_offs, row_mask, cols, vocab):
    """The same chunk with NaN off the rows and the vocabulary: NaN fails every comparison, so the
    search passes need no separate mask."""
    valid = row_mask[:, None] & (cols < vocab)[None, :]
    x = tl.load(logits_ptr + row_offs[:, None] + cols[None, :], mask=valid, other=float("nan"))
    return x.to(tl.float32)


@triton.jit
def _row_max_min(logits_ptr, row_offs, row_mask, vocab, BLOCK_ROWS: tl.constexpr, BLOCK_V: tl.constexpr):
    """Per row: the largest logit, the smallest and the smallest finite one (-inf logits, such as
    banned tokens, give the window of sampling_candidates.py no scale)."""
    lane_max = tl.full([BLOCK_ROWS, BLOCK_V], float("-inf"), tl.float32)
    lane_min = tl.full([BLOCK_ROWS, BLOCK_V], float("inf"), tl.float32)
    lane_finite_min = tl.full([BLOCK_ROWS, BLOCK_V], float("inf"), tl.float32)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x, valid = _load_logits(logits_ptr, row_offs, row_mask, cols, vocab)
        lane_max = tl.maximum(lane_max, x)
        lane_min = tl.minimum(lane_min, tl.where(valid, x, float("inf")))
        lane_finite_min = tl.minimum(lane_finite_min, tl.where(x > float("-inf"), x, float("inf")))
    # rows past num_rows get finite stats, so their (unstored) lanes make no NaN from -inf - -inf
    row_max = tl.where(row_mask, tl.max(lane_max, axis=1), 0.0)
    row_min = tl.where(row_mask, tl.min(lane_min, axis=1), 0.0)
    return row_max, row_min, tl.where(row_mask, tl.min(lane_finite_min, axis=1), 0.0)


@triton.jit
def _pivots(lo, hi):
    """Four keys splitting (lo, hi) into five near-equal parts."""
    span = hi - lo
    return lo + span // 5, lo + span * 2 // 5, lo + span * 3 // 5, lo + span * 4 // 5


@triton.jit
def _narrow(lo, hi, p1, p2, p3, p4, low1, low2, low3, low4):
    """(lo, hi) -> the part between neighbouring pivots where the search predicate flips; low_j:
    pivot j lies on lo's side (monotone: low1 >= low2 >= low3 >= low4)."""
    new_lo = tl.where(low4, p4, tl.where(low3, p3, tl.where(low2, p2, tl.where(low1, p1, lo))))
    new_hi = tl.where(~low1, p1, tl.where(~low2, p2, tl.where(~low3, p3, tl.where(~low4, p4, hi))))
    return new_lo, new_hi


@triton.jit
def _pivot_sums(logits_ptr, row_offs, row_mask, vocab, lo, hi, row_max_2d, scale, KEY_BITS: tl.constexpr,
                MASS: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """The four pivots of (lo, hi) and, per row, what lies above each in one pass over the logits:
    the count of x >= pivot, or (MASS) the softmax mass exp2((x - row_max) * scale) of x > pivot."""
    DTYPE: tl.constexpr = logits_ptr.dtype.element_ty
    p1, p2, p3, p4 = _pivots(lo, hi)
    t1 = _key_to_float(p1, KEY_BITS, DTYPE)[:, None]
    t2 = _key_to_float(p2, KEY_BITS, DTYPE)[:, None]
    t3 = _key_to_float(p3, KEY_BITS, DTYPE)[:, None]
    t4 = _key_to_float(p4, KEY_BITS, DTYPE)[:, None]
    ACC: tl.constexpr = tl.float32 if MASS else tl.int32
    s1 = tl.zeros([BLOCK_ROWS, BLOCK_V], ACC)
    s2 = tl.zeros([BLOCK_ROWS, BLOCK_V], ACC)
    s3 = tl.zeros([BLOCK_ROWS, BLOCK_V], ACC)
    s4 = tl.zeros([BLOCK_ROWS, BLOCK_V], ACC)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = _load_for_search(logits_ptr, row_offs, row_mask, cols, vocab)
        if MASS:
            mass = tl.exp2((x - row_max_2d) * scale)
            s1 += tl.where(x > t1, mass, 0.0)
            s2 += tl.where(x > t2, mass, 0.0)
            s3 += tl.where(x > t3, mass, 0.0)
            s4 += tl.where(x > t4, mass, 0.0)
        else:
            s1 += (x >= t1).to(tl.int32)
            s2 += (x >= t2).to(tl.int32)
            s3 += (x >= t3).to(tl.int32)
            s4 += (x >= t4).to(tl.int32)
    return p1, p2, p3, p4, tl.sum(s1, axis=1), tl.sum(s2, axis=1), tl.sum(s3, axis=1), tl.sum(s4, axis=1)


@triton.jit
def _top_k_threshold(logits_ptr, row_offs, row_mask, vocab, k, row_max, row_min, KEY_BITS: tl.constexpr,
                     SEARCH_STEPS: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """The k-th largest logit of each row: the largest key with count(x >= key) >= k."""
    DTYPE: tl.constexpr = logits_ptr.dtype.element_ty
    lo = _float_to_key(row_min, KEY_BITS, DTYPE)  # count(x >= min) = vocab >= k: feasible
    hi = _float_to_key(row_max, KEY_BITS, DTYPE) + 1  # count(x > max) = 0 < k: infeasible
    for _step in range(SEARCH_STEPS):
        p1, p2, p3, p4, c1, c2, c3, c4 = _pivot_sums(
            logits_ptr, row_offs, row_mask, vocab, lo, hi, None, None, KEY_BITS, False, BLOCK_ROWS, BLOCK_V
        )
        lo, hi = _narrow(lo, hi, p1, p2, p3, p4, c1 >= k, c2 >= k, c3 >= k, c4 >= k)
    return _key_to_float(lo, KEY_BITS, DTYPE)


@triton.jit
def _top_p_threshold(logits_ptr, row_offs, row_mask, vocab, temperature, top_p, row_max, thr_k,
                     KEY_BITS: tl.constexpr, SEARCH_STEPS: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                     BLOCK_V: tl.constexpr):  # fmt: skip
    """The smallest key with mass(x > key) < top_p * mass(x >= thr_k), counting only top-k
    survivors (x >= thr_k); a token's mass is exp((x - row_max) / T), its softmax numerator."""
    DTYPE: tl.constexpr = logits_ptr.dtype.element_ty
    scale = (1.4426950408889634 / temperature)[:, None]  # log2(e) / T: masses through exp2
    row_max_2d = row_max[:, None]
    lane_mass = tl.zeros([BLOCK_ROWS, BLOCK_V], tl.float32)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = _load_for_search(logits_ptr, row_offs, row_mask, cols, vocab)
        lane_mass += tl.where(x >= thr_k[:, None], tl.exp2((x - row_max_2d) * scale), 0.0)
    limit = top_p * tl.sum(lane_mass, axis=1)
    lo = _float_to_key(thr_k, KEY_BITS, DTYPE) - 1  # all surviving mass lies above: infeasible
    hi = _float_to_key(row_max, KEY_BITS, DTYPE)  # no mass above the maximum: feasible for top_p > 0
    for _step in range(SEARCH_STEPS):
        # every pivot is >= thr_k, so x > pivot implies a top-k survivor
        p1, p2, p3, p4, m1, m2, m3, m4 = _pivot_sums(
            logits_ptr, row_offs, row_mask, vocab, lo, hi, row_max_2d, scale, KEY_BITS, True, BLOCK_ROWS, BLOCK_V
        )
        # infeasible pivots (too much mass above) lie on lo's side
        lo, hi = _narrow(lo, hi, p1, p2, p3, p4, m1 >= limit, m2 >= limit, m3 >= limit, m4 >= limit)
    return _key_to_float(hi, KEY_BITS, DTYPE)


@triton.jit
def _any(flags):
    return tl.max(flags.to(tl.int32), axis=0) > 0


@triton.jit
def _searched_threshold(logits_ptr, row_offs, row_mask, vocab, temperature, top_k, use_top_k, top_p, use_top_p,
                        row_max, row_min, KEY_BITS: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                        BLOCK_ROWS: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Per row, the smallest logit that survives top-k and then top-p (row_min where neither is on),
    by full-vocabulary searches; a filter's passes run only when some row of the program uses it."""
    thr_k = row_min
    if _any(use_top_k):
        found = _top_k_threshold(
            logits_ptr, row_offs, row_mask, vocab, top_k, row_max, row_min, KEY_BITS, SEARCH_STEPS, BLOCK_ROWS, BLOCK_V
        )
        thr_k = tl.where(use_top_k, found, row_min)
    thr_p = thr_k
    if _any(use_top_p):
        found = _top_p_threshold(
            logits_ptr, row_offs, row_mask, vocab, temperature, top_p, row_max, thr_k, KEY_BITS, SEARCH_STEPS,
            BLOCK_ROWS, BLOCK_V,
        )  # fmt: skip
        thr_p = tl.where(use_top_p, found, thr_k)
    return thr_p


@triton.jit
def _gumbel(u):
    """Gumbel noise -log(-log(u)) of uniforms u; u = 0 (probability 2^-31) is lifted so that a
    surviving token's score stays finite."""
    return -tl.log(-tl.log(tl.maximum(u, 1.0e-30)))
