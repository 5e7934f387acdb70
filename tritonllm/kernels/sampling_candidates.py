"""Top-k / top-p over a few candidates instead of the whole vocabulary.

A row that top-k or top-p cuts keeps few tokens (tens for top-k 50, a handful for a peaked top-p),
yet a threshold search over the vocabulary costs a pass per step (sampling_search.py: 14 passes
for top-k plus top-p in bfloat16). Here a row instead
  1. finds a window w: a logit value with between `need` and COMPACT tokens at or above it (need:
     top_k, or 1), and, for a row with top-p but no top-k, at least top_p of the softmax mass
     there, so that every survivor lies at or above w. Each pass over the vocabulary counts the
     tokens (and their mass) above WINDOW_PIVOTS values at once: the first pass places them at
     distances from the row maximum that shrink by sqrt(2) (a bulk of logits and a long upper
     tail put the top tens at a tenth to a half of the range), later ones split the bracket the
     last pass left linearly. Usually one pass finds it.
  2. copies the tokens at or above w (value and id) into a per-row scratch of COMPACT slots, in
     vocabulary order (one pass with a prefix sum per chunk);
  3. finds the exact top-k and top-p thresholds among them in registers (the key searches of
     sampling_search.py, 16 keys per step over [COMPACT] values), and draws among them.
A row whose window is not found in WINDOW_PASSES passes (ties wider than COMPACT, top-p over a
flat distribution, top_k > COMPACT) falls back to the full-vocabulary searches. The thresholds are
the same logit values either search finds, and a draw among candidates gives each token the same
Gumbel noise (Philox of (seed, token id)) as a draw over the vocabulary, so the fallback changes
no token.
"""

from __future__ import annotations

from tritonllm import platform  # noqa: F401  isort: skip  (on CPU it switches on the interpreter before triton loads)

import triton
import triton.language as tl

from tritonllm.kernels.sampling_search import _any, _float_to_key, _gumbel, _key_to_float, _load_for_search

WINDOW_PIVOTS = tl.constexpr(8)  # values counted per window pass
WINDOW_PASSES = tl.constexpr(4)  # window passes before a row falls back to the full-vocabulary searches
CANDIDATE_PIVOTS = tl.constexpr(16)  # keys tried per step of a search among candidates


@triton.jit
def _window_pivots(lo_v, hi_v, first):
    """[rows, WINDOW_PIVOTS] ascending values inside (lo_v, hi_v]: on the first pass at distances
    (hi - lo) * 2^-(j+1)/2 below hi_v (the last one at hi_v, the row maximum, itself), on later passes
    splitting (lo_v, hi_v) into WINDOW_PIVOTS + 1 equal parts."""
    j = tl.arange(0, WINDOW_PIVOTS)[None, :].to(tl.float32)
    geometric = tl.where(j == WINDOW_PIVOTS - 1, 0.0, tl.exp2(-(j + 1.0) * 0.5))
    linear = 1.0 - (j + 1.0) / (WINDOW_PIVOTS + 1)
    fraction = tl.where(first, geometric, linear)
    return hi_v[:, None] - (hi_v - lo_v)[:, None] * fraction


@triton.jit
def _window_sums(logits_ptr, row_offs, row_mask, vocab, pivots, row_max_2d, scale, WITH_MASS: tl.constexpr,
                 BLOCK_ROWS: tl.constexpr, BLOCK_W: tl.constexpr):  # fmt: skip
    """One pass: per row and pivot, the count of x >= pivot and (WITH_MASS) their softmax mass
    exp2((x - row_max) * scale), and the row's whole mass."""
    pivots_3d = pivots[:, :, None]
    counts = tl.zeros([BLOCK_ROWS, WINDOW_PIVOTS, BLOCK_W], tl.int32)
    masses = tl.zeros([BLOCK_ROWS, WINDOW_PIVOTS, BLOCK_W], tl.float32)
    total = tl.zeros([BLOCK_ROWS, BLOCK_W], tl.float32)
    for start in range(0, vocab, BLOCK_W):
        cols = start + tl.arange(0, BLOCK_W)
        x = _load_for_search(logits_ptr, row_offs, row_mask, cols, vocab)  # NaN off the rows: never above
        above = x[:, None, :] >= pivots_3d
        counts += above.to(tl.int32)
        if WITH_MASS:
            mass = tl.where(x == x, tl.exp2((x - row_max_2d) * scale), 0.0)
            total += mass
            masses += tl.where(above, mass[:, None, :], 0.0)
    return tl.sum(counts, axis=2), tl.sum(masses, axis=2), tl.sum(total, axis=1)


@triton.jit
def _pick(values, j, index):
    """values[row, index[row]] of a [rows, WINDOW_PIVOTS] array (0 where index is out of range)."""
    return tl.sum(tl.where(j == index[:, None], values, 0.0), axis=1)


@triton.jit
def _find_window(logits_ptr, row_offs, row_mask, vocab, searching, need, top_p, mass_rows, row_max, floor, scale,
                 COMPACT: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_W: tl.constexpr):  # fmt: skip
    """(found, w, total mass) per row: w has need <= count(x >= w) <= COMPACT and, on mass_rows,
    mass(x >= w) >= top_p * total. Passes stop once every searching row has its window."""
    j = tl.arange(0, WINDOW_PIVOTS)[None, :]
    found = ~searching
    w = row_max
    lo_v = floor  # the smallest finite logit
    hi_v = row_max
    total = tl.zeros([BLOCK_ROWS], tl.float32)
    row_max_2d = row_max[:, None]
    scale_2d = scale[:, None]
    step = 0
    while (step < WINDOW_PASSES) & _any(~found):
        pivots = _window_pivots(lo_v, hi_v, step == 0)
        if _any(mass_rows & ~found):
            counts, masses, total = _window_sums(
                logits_ptr, row_offs, row_mask, vocab, pivots, row_max_2d, scale_2d, True, BLOCK_ROWS, BLOCK_W
            )
        else:
            counts, masses, _ = _window_sums(
                logits_ptr, row_offs, row_mask, vocab, pivots, row_max_2d, scale_2d, False, BLOCK_ROWS, BLOCK_W
            )
        limit = tl.where(mass_rows, top_p * total, 0.0)
        few_enough = counts <= COMPACT  # false below some pivot, true from it up (counts fall as pivots rise)
        enough = (counts >= need[:, None]) & (masses >= limit[:, None])  # true up to some pivot
        best = tl.max(tl.where(few_enough & enough, j, -1), axis=1)  # the highest pivot inside the window
        hit = ~found & (best >= 0)
        w = tl.where(hit, _pick(pivots, j, best), w)
        # no pivot inside: the window lies between the last pivot with too many tokens and the
        # first with too few (or too little mass)
        too_many = tl.max(tl.where(few_enough, -1, j), axis=1)
        too_few = tl.min(tl.where(enough, WINDOW_PIVOTS, j), axis=1)
        lo_v = tl.where(too_many >= 0, _pick(pivots, j, too_many), lo_v)
        hi_v = tl.where(too_few < WINDOW_PIVOTS, _pick(pivots, j, too_few), hi_v)
        found = found | hit
        step += 1
    return found & searching, w, total


@triton.jit
def _compact(logits_ptr, cand_x_ptr, cand_id_ptr, rows, row_offs, row_mask, vocab, take, w,
             COMPACT: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Copy the tokens x >= w of the `take` rows, value (float32) and id, to their scratch rows in
    vocabulary order; returns how many each row has (<= COMPACT by the window)."""
    count = tl.zeros([BLOCK_ROWS], tl.int32)
    base = (rows.to(tl.int64) * COMPACT)[:, None]
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = _load_for_search(logits_ptr, row_offs, row_mask, cols, vocab)
        keep = (x >= w[:, None]) & take[:, None]
        slot = count[:, None] + tl.cumsum(keep.to(tl.int32), axis=1) - 1
        store = keep & (slot < COMPACT)
        tl.store(cand_x_ptr + base + slot, x, mask=store)
        tl.store(cand_id_ptr + base + slot, cols[None, :] + tl.zeros_like(slot), mask=store)
        count += tl.sum(keep.to(tl.int32), axis=1)
    tl.debug_barrier()  # the program's threads read each other's slots next
    return tl.minimum(count, COMPACT)


@triton.jit
def load_candidates(cand_x_ptr, cand_id_ptr, rows, num_candidates, COMPACT: tl.constexpr):
    """(values, ids, valid) [rows, COMPACT] of the candidates `_compact` stored."""
    slots = tl.arange(0, COMPACT)[None, :]
    valid = slots < num_candidates[:, None]
    offs = (rows.to(tl.int64) * COMPACT)[:, None] + slots
    x = tl.load(cand_x_ptr + offs, mask=valid, other=float("-inf"))
    ids = tl.load(cand_id_ptr + offs, mask=valid, other=0)
    return x, ids, valid


@triton.jit
def _narrow_keys(keys, weights, lo, hi, target, STRICT: tl.constexpr, STEPS: tl.constexpr):
    """Shrink int64 key ranges (lo, hi) [rows] around where sum(weights of keys above k) >= target
    stops holding (above: >= k, or > k if STRICT; lo's side holds it): each step tries
    CANDIDATE_PIVOTS keys and keeps one of CANDIDATE_PIVOTS + 1 parts; STEPS steps leave hi = lo + 1."""
    keys_3d = keys.to(tl.int32)[:, None, :]  # every pivot lies in [lo, hi): within the keys' int32 range
    weights_3d = weights[:, None, :]
    parts = CANDIDATE_PIVOTS + 1
    j = (tl.arange(0, CANDIDATE_PIVOTS) + 1).to(tl.int64)[None, :]
    for _step in tl.static_range(STEPS):
        span = hi - lo
        pivots = (lo[:, None] + span[:, None] * j // parts).to(tl.int32)[:, :, None]
        above = (keys_3d > pivots) if STRICT else (keys_3d >= pivots)
        sums = tl.sum(tl.where(above, weights_3d, 0.0), axis=2)
        on_lo_side = tl.sum((sums >= target[:, None]).to(tl.int64), axis=1)  # monotone: the first ones
        lo, hi = lo + span * on_lo_side // parts, lo + span * (on_lo_side + 1) // parts
    return lo, hi


@triton.jit
def _candidate_threshold(x, valid, temperature, top_k, use_top_k, top_p, use_top_p, row_max, w, total,
                         KEY_BITS: tl.constexpr, DTYPE: tl.constexpr, STEPS: tl.constexpr):  # fmt: skip
    """The top-k-then-top-p threshold of rows whose survivors are all among their candidates x
    (>= w): the same logit value `sampling_search._searched_threshold` finds."""
    keys = _float_to_key(x, KEY_BITS, DTYPE)
    count_weights = valid.to(tl.float32)
    lo = _float_to_key(w, KEY_BITS, DTYPE)  # count(x >= w) >= top_k: feasible
    hi = _float_to_key(row_max, KEY_BITS, DTYPE) + 1
    lo, hi = _narrow_keys(keys, count_weights, lo, hi, top_k.to(tl.float32), False, STEPS)
    thr_k = tl.where(use_top_k, _key_to_float(lo, KEY_BITS, DTYPE), w)
    # top-p: renormalised over the top-k survivors, or over the whole vocabulary (total) without top-k
    scale = (1.4426950408889634 / temperature)[:, None]
    mass = tl.where(valid & (x >= thr_k[:, None]), tl.exp2((x - row_max[:, None]) * scale), 0.0)
    limit = top_p * tl.where(use_top_k, tl.sum(mass, axis=1), total)
    lo = _float_to_key(thr_k, KEY_BITS, DTYPE) - 1
    hi = _float_to_key(row_max, KEY_BITS, DTYPE)
    lo, hi = _narrow_keys(keys, mass, lo, hi, limit, True, STEPS)
    return tl.where(use_top_p, _key_to_float(hi, KEY_BITS, DTYPE), thr_k)


@triton.jit
def candidate_threshold(logits_ptr, cand_x_ptr, cand_id_ptr, rows, row_offs, row_mask, vocab, temperature, top_k,
                        use_top_k, top_p, use_top_p, row_max, finite_min, KEY_BITS: tl.constexpr,
                        CANDIDATE_STEPS: tl.constexpr, COMPACT: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                        BLOCK_V: tl.constexpr, BLOCK_W: tl.constexpr):  # fmt: skip
    """(found, threshold, number of candidates) per row: rows with top-k or top-p whose survivors
    the window put in the scratch get their threshold from there; `found` is false for the others,
    whose threshold is meaningless. finite_min: the row's smallest finite logit, the window's floor."""
    DTYPE: tl.constexpr = logits_ptr.dtype.element_ty
    searching = (use_top_k | use_top_p) & (~use_top_k | (top_k <= COMPACT))
    need = tl.where(use_top_k, top_k, 1)
    mass_rows = use_top_p & ~use_top_k
    scale = 1.4426950408889634 / temperature
    found, w, total = _find_window(
        logits_ptr, row_offs, row_mask, vocab, searching, need, top_p, mass_rows, row_max, finite_min, scale, COMPACT,
        BLOCK_ROWS, BLOCK_W,
    )  # fmt: skip
    threshold = row_max
    num_candidates = tl.zeros([BLOCK_ROWS], tl.int32)
    if _any(found):
        num_candidates = _compact(
            logits_ptr, cand_x_ptr, cand_id_ptr, rows, row_offs, row_mask, vocab, found, w, COMPACT, BLOCK_ROWS, BLOCK_V
        )
        x, _, valid = load_candidates(cand_x_ptr, cand_id_ptr, rows, num_candidates, COMPACT)
        threshold = _candidate_threshold(
            x, valid, temperature, top_k, use_top_k, top_p, use_top_p, row_max, w, total, KEY_BITS, DTYPE,
            CANDIDATE_STEPS,
        )  # fmt: skip
    return found, threshold, num_candidates


@triton.jit
def draw_candidates(x, ids, survives, seeds, temperature, vocab):
    """Gumbel-max among candidates: token t's noise is output t % 4 of Philox(seed, t // 4), as in a
    draw over the whole vocabulary. Returns the token per row (first id on ties)."""
    u0, u1, u2, u3 = tl.rand4x(seeds[:, None] + tl.zeros_like(ids).to(tl.int64), ids // 4)
    lane = ids % 4
    u = tl.where(lane == 0, u0, tl.where(lane == 1, u1, tl.where(lane == 2, u2, u3)))
    score = tl.where(survives, x + temperature[:, None] * _gumbel(u), float("-inf"))
    best = tl.max(score, axis=1)
    return tl.min(tl.where(survives & (score == best[:, None]), ids, vocab), axis=1)
