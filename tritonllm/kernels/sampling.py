"""Sampling on the device: log-softmax, the top-k / top-p / min-p mask, and one draw per row.

Every kernel gives a program BLOCK_ROWS rows (1 on a GPU, many under the interpreter) and loops
over the vocabulary in chunks of BLOCK_V, so any vocabulary size fits in registers. Passes over
the vocabulary accumulate per lane ([BLOCK_ROWS, BLOCK_V]) and reduce once at the end, so the
loop body has no cross-warp reduction.

No sort: the filters become one threshold per row on the raw logits x (a token survives iff
x >= threshold; dividing by a positive temperature keeps the order, so the survivors are those of
s = x / temperature). top-k and top-p thresholds are searched over the bit patterns of the
logits' dtype (an order-preserving integer key), each step a pass over the vocabulary that tries
4 keys and keeps 1/5 of the range: 7 steps pin a bfloat16/float16 value, 14 a float32 one. The
threshold found is an exact logit value, so ties are kept together as in `reference.sampling_mask`:
  top_k  the k-th largest x: the largest threshold with count(x >= thr) >= k;
  top_p  t survives iff the renormalised mass of tokens with x > x_t is below top_p: the smallest
         threshold with mass(x > thr) < top_p * mass(top-k survivors), mass exp((x - max x) / T);
  min_p  p_t >= min_p * max p  <=>  x_t >= max x + T * log(min_p): the row maximum suffices.
Which rows use which filter is read on the device; a program skips the passes that none of its
rows needs, so launches need no host sync.
Sampling is Gumbel-max: argmax over survivors of x + T * Gumbel noise (= argmax of x / T + noise),
the noise drawn by Philox from (row seed, token id), so a seed gives the same token whichever
batch the row is in.
"""

from __future__ import annotations

import functools

from tritonllm import platform  # isort: skip  (on CPU it switches on the interpreter before triton loads)

import torch
import triton
import triton.language as tl

from tritonllm.kernels.launch import DEFAULT_NUM_STAGES, Launcher, aligned, int_spec

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
    lane_max = tl.full([BLOCK_ROWS, BLOCK_V], float("-inf"), tl.float32)
    lane_min = tl.full([BLOCK_ROWS, BLOCK_V], float("inf"), tl.float32)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x, valid = _load_logits(logits_ptr, row_offs, row_mask, cols, vocab)
        lane_max = tl.maximum(lane_max, x)
        lane_min = tl.minimum(lane_min, tl.where(valid, x, float("inf")))
    # rows past num_rows get finite stats, so their (unstored) lanes make no NaN from -inf - -inf
    row_max = tl.where(row_mask, tl.max(lane_max, axis=1), 0.0)
    return row_max, tl.where(row_mask, tl.min(lane_min, axis=1), 0.0)


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
def _survival_threshold(logits_ptr, row_offs, row_mask, vocab, temperature, top_k, use_top_k, top_p,
                        use_top_p, min_p, use_min_p, KEY_BITS: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                        BLOCK_ROWS: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Per row, the smallest logit that survives top-k, top-p and min-p (-inf: every token does).
    A filter's passes run only when some row of the program uses it."""
    threshold = tl.full([BLOCK_ROWS], float("-inf"), tl.float32)
    if _any(use_top_k | use_top_p | use_min_p):
        row_max, row_min = _row_max_min(logits_ptr, row_offs, row_mask, vocab, BLOCK_ROWS, BLOCK_V)
        thr_k = row_min
        if _any(use_top_k):
            found = _top_k_threshold(
                logits_ptr, row_offs, row_mask, vocab, top_k, row_max, row_min, KEY_BITS, SEARCH_STEPS,
                BLOCK_ROWS, BLOCK_V,
            )  # fmt: skip
            thr_k = tl.where(use_top_k, found, row_min)
        thr_p = thr_k
        if _any(use_top_p):
            found = _top_p_threshold(
                logits_ptr, row_offs, row_mask, vocab, temperature, top_p, row_max, thr_k, KEY_BITS,
                SEARCH_STEPS, BLOCK_ROWS, BLOCK_V,
            )  # fmt: skip
            thr_p = tl.where(use_top_p, found, thr_k)
        thr_min_p = row_max + temperature * tl.log(tl.where(use_min_p, min_p, 1.0))
        threshold = tl.where(use_min_p, tl.maximum(thr_p, thr_min_p), thr_p)
    return threshold


@triton.jit
def _gumbel_noise(seeds, start, BLOCK_ROWS: tl.constexpr, BLOCK_V: tl.constexpr):
    """Gumbel noise -log(-log(u)) for tokens start .. start + BLOCK_V of each row. Token t takes
    output t % 4 of Philox(seed, t // 4): one Philox call serves four tokens."""
    quads = start // 4 + tl.arange(0, BLOCK_V // 4)[None, :] + tl.zeros([BLOCK_ROWS, BLOCK_V // 4], tl.int32)
    seeds_2d = seeds[:, None] + tl.zeros([BLOCK_ROWS, BLOCK_V // 4], tl.int64)
    u0, u1, u2, u3 = tl.rand4x(seeds_2d, quads)
    u = tl.reshape(tl.join(tl.join(u0, u2), tl.join(u1, u3)), [BLOCK_ROWS, BLOCK_V])  # u0 u1 u2 u3 u0 ...
    # u = 0 (probability 2^-31) is lifted so that a surviving token's score stays finite
    return -tl.log(-tl.log(tl.maximum(u, 1.0e-30)))


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
    num_rows,
    vocab,
    row_stride,
    KEY_BITS: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = rows < num_rows
    temperature, top_k, use_top_k, top_p, use_top_p, min_p, use_min_p = _load_row_params(
        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, rows, row_mask, vocab
    )
    temperature = tl.where(temperature > 0, temperature, 1.0)
    row_offs = rows.to(tl.int64) * row_stride
    threshold = _survival_threshold(
        logits_ptr, row_offs, row_mask, vocab, temperature, top_k, use_top_k, top_p, use_top_p, min_p,
        use_min_p, KEY_BITS, SEARCH_STEPS, BLOCK_ROWS, BLOCK_V,
    )[:, None]  # fmt: skip
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x, valid = _load_logits(logits_ptr, row_offs, row_mask, cols, vocab)
        tl.store(mask_ptr + (rows.to(tl.int64) * vocab)[:, None] + cols[None, :], x >= threshold, mask=valid)


@triton.jit
def _sample_kernel(
    logits_ptr,  # [num_rows, vocab], rows row_stride apart, any float dtype
    out_ptr,  # [num_rows] int64: the drawn token ids
    temperature_ptr,  # [num_rows] float; <= 0: greedy (argmax, first index on ties, no filter)
    top_k_ptr,  # [num_rows] int
    top_p_ptr,  # [num_rows] float
    min_p_ptr,  # [num_rows] float
    seeds_ptr,  # [num_rows] int64: Philox seed of each row for this step
    num_rows,
    vocab,
    row_stride,
    KEY_BITS: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = rows < num_rows
    temperature, top_k, use_top_k, top_p, use_top_p, min_p, use_min_p = _load_row_params(
        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, rows, row_mask, vocab
    )
    sampled = temperature > 0
    temperature = tl.where(sampled, temperature, 1.0)
    row_offs = rows.to(tl.int64) * row_stride
    threshold = _survival_threshold(
        logits_ptr, row_offs, row_mask, vocab, temperature, top_k, use_top_k & sampled, top_p,
        use_top_p & sampled, min_p, use_min_p & sampled, KEY_BITS, SEARCH_STEPS, BLOCK_ROWS, BLOCK_V,
    )[:, None]  # fmt: skip
    any_sampled = _any(sampled & row_mask)
    noise_scale = tl.where(sampled, temperature, 0.0)[:, None]  # greedy rows: no noise
    seeds = tl.load(seeds_ptr + rows, mask=row_mask, other=0).to(tl.int64)
    lane_best = tl.full([BLOCK_ROWS, BLOCK_V], float("-inf"), tl.float32)
    lane_token = tl.zeros([BLOCK_ROWS, BLOCK_V], tl.int32)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x, valid = _load_logits(logits_ptr, row_offs, row_mask, cols, vocab)
        score = x
        if any_sampled:
            score = x + noise_scale * _gumbel_noise(seeds, start, BLOCK_ROWS, BLOCK_V)
        score = tl.where(valid & (x >= threshold), score, float("-inf"))
        # strictly better only: a lane keeps its earliest best token, as argmax keeps the first
        better = score > lane_best
        lane_token = tl.where(better, cols[None, :], lane_token)
        lane_best = tl.where(better, score, lane_best)
    best = tl.max(lane_best, axis=1)
    best_token = tl.min(tl.where(lane_best == best[:, None], lane_token, vocab), axis=1)
    tl.store(out_ptr + rows, tl.where(best_token < vocab, best_token, 0).to(tl.int64), mask=row_mask)


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


_SAMPLING_MASK = Launcher(_sampling_mask_kernel)
_SAMPLE = Launcher(_sample_kernel)
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


@functools.cache
def _search_config(dtype: torch.dtype) -> tuple[int, int]:
    """(KEY_BITS, SEARCH_STEPS) for logits of dtype. KEY_BITS: width of the dtype; SEARCH_STEPS:
    narrowing steps that pin a threshold among 2^KEY_BITS + 1 keys exactly, each step keeping one of
    _NUM_PIVOTS + 1 parts."""
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"logits must be float32, float16 or bfloat16, got {dtype}")
    key_bits = 8 * dtype.itemsize
    span, steps, parts = 2**key_bits + 1, 0, _NUM_PIVOTS + 1
    while span > 1:
        span, steps = -(-span // parts), steps + 1
    return key_bits, steps


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
    block_rows, block_v, num_warps = _launch_config(num_rows, vocab)
    key_bits, search_steps = _search_config(logits.dtype)
    row_stride = logits.stride(0)
    args = (logits, mask, temperature, top_k, top_p, min_p, num_rows, vocab, row_stride)
    constexprs = dict(KEY_BITS=key_bits, SEARCH_STEPS=search_steps, BLOCK_ROWS=block_rows, BLOCK_V=block_v)
    device_index = logits.device.index or 0
    # mask is bool; vocab and the row stride are fixed by the model: raw values
    key = (
        logits.dtype, temperature.dtype, top_k.dtype, top_p.dtype, min_p.dtype,
        aligned(logits, mask, temperature, top_k, top_p, min_p), int_spec(num_rows), vocab, row_stride,
    )  # fmt: skip
    _SAMPLING_MASK(
        key, (triton.cdiv(num_rows, block_rows),), args, constexprs, num_warps=num_warps, num_stages=DEFAULT_NUM_STAGES,
        device_index=device_index,
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
    block_rows, block_v, num_warps = _launch_config(num_rows, vocab)
    key_bits, search_steps = _search_config(logits.dtype)
    row_stride = logits.stride(0)
    args = (logits, out, temperature, top_k, top_p, min_p, seeds, num_rows, vocab, row_stride)
    constexprs = dict(KEY_BITS=key_bits, SEARCH_STEPS=search_steps, BLOCK_ROWS=block_rows, BLOCK_V=block_v)
    device_index = logits.device.index or 0
    # out is int64; vocab and the row stride are fixed by the model: raw values
    key = (
        logits.dtype, temperature.dtype, top_k.dtype, top_p.dtype, min_p.dtype, seeds.dtype,
        aligned(logits, out, temperature, top_k, top_p, min_p, seeds), int_spec(num_rows), vocab, row_stride,
    )  # fmt: skip
    _SAMPLE(
        key, (triton.cdiv(num_rows, block_rows),), args, constexprs, num_warps=num_warps, num_stages=DEFAULT_NUM_STAGES,
        device_index=device_index,
    )  # fmt: skip
    return out
