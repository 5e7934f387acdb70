"""Alignment of a batch's (token, slot) pairs to the fused-MoE GEMM's row blocks, in Triton.

The T * k pairs (pair p = t * k + j: token t's j-th expert topk_ids[t, j]) are sorted by expert,
each expert's segment padded to a multiple of BLOCK_M, so that every BLOCK_M rows of the sorted
list belong to one expert: the grouped GEMM (kernels/moe.py) takes one block per program row, its
expert from `block_expert`. Sizes are static upper bounds, T * k + E * (BLOCK_M - 1) entries
rounded up to whole blocks, so the GEMM's grid depends on T, k, E and BLOCK_M only: no host
synchronisation, and a decode step's launches can be captured in a CUDA graph. Padding entries hold
T * k (masked by the GEMM); blocks past the last expert's segment hold expert E (skipped). Each
expert's pairs stay in pair (token) order, so the result, and the GEMM's, is deterministic.
kernels/reference.py's `moe_align` defines the result with torch ops.

The pairs are split into ranges of `pairs_per_program`, one program each:

1. counts[x]: pairs routed to expert x (tl.histogram, COUNT_STEP pairs at a time), and before[x]:
   those among earlier ranges. The segments start at start[x] = the exclusive cumsum of
   padded[x] = cdiv(counts[x], BLOCK_M) * BLOCK_M.
2. The program's pairs, STEP at a time in order: pair p goes to running[e] + (pairs of expert e
   earlier among the STEP), e = p's expert, where running[e] (start + before, then advanced by
   each STEP's histogram) is read with tl.gather and the rank within the STEP is a [STEP, STEP]
   comparison: a stable counting sort.
3. Its share of the blocks: block b (rows b * BLOCK_M ...) belongs to the first expert whose
   padded segment ends after the block's first row (E - the count of those that do: the
   searchsorted of the torch version); its rows from start[x] + counts[x] of that expert on, and
   all rows of unused blocks, are padding. Pairs and padding land on disjoint entries, so nothing
   is zero-filled first and the program needs no barrier.

Up to MAX_SINGLE_PAIRS pairs (decode: 16 tokens at top-8): ONE program and ONE launch, which
counts all the pairs itself, then places them. Above, TWO launches: `moe_count_kernel` writes each
range's histogram to counts [programs, BLOCK_E], then each program of `moe_align_kernel` sums the
rows (all for the totals, those before its own for `before`; at most MAX_PROGRAMS rows, from L2)
and places its range, the ranges in parallel. Why the threshold is that low: step 2 is a serial
loop whose iterations (a gather, a histogram, a reduction: shared-memory round trips) cost about
1 us per STEP pairs on an H200, while a second launch in a CUDA graph costs 1-2 us. Measured
there (E 128, top-8, BLOCK_M 16, each call's time inside a graph): one program 6.6 us at 1 token
and 7.4 at 16 (the ten torch ops: 51 and 53 us); two launches 7.5-11 us from 64 to 2048 tokens
and 17-20 us at 8192 (torch: 79-144 us), against 14 us (64 tokens) and 1.4 ms (8192) for one
program (scripts/bench_moe_align.py, experiments/moe/README.md). Ranges of max(2 * STEP,
T * k / MAX_PROGRAMS) pairs were the fastest split measured at each size: shorter ones make every
program sum more count rows, longer ones leave a long serial loop.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from tritonllm.kernels.launch import pdl_launch, pdl_wait

STEP = 64  # pairs a program places at once: a [STEP, STEP] comparison ranks each pair within its expert
COUNT_STEP = 1024  # pairs a program counts at once (one tl.histogram)
TILE = 8192  # elements of the [rows, BLOCK_E] and [blocks, BLOCK_E] tiles a program reduces at once
MAX_SINGLE_PAIRS = 128  # up to this many pairs: one program, one launch (module docstring)
SINGLE_WARPS, RANGE_WARPS = 8, 4  # the faster on an H200 for one program / for many
MIN_PAIRS_PER_PROGRAM = 2 * STEP  # above MAX_SINGLE_PAIRS: ranges of at least this many pairs ...
MAX_PROGRAMS = 128  # ... in at most this many programs


class MoeAlignment(NamedTuple):
    sorted_ids: torch.Tensor  # int32 [num_blocks * BLOCK_M]: pair ids by expert, padded with T * k
    block_expert: torch.Tensor  # int32 [num_blocks]: each block's expert (E: an unused block)
    num_pairs: int  # T * k
    num_blocks: int  # the static bound: cdiv(T * k + E * (BLOCK_M - 1), BLOCK_M)


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Blocks of BLOCK_M rows that any routing of num_pairs pairs over num_experts experts may need."""
    return triton.cdiv(num_pairs + num_experts * (block_m - 1), block_m)


@triton.jit
def _histogram(ids_ptr, lo, hi, BLOCK_E: tl.constexpr, STEP: tl.constexpr):
    """Pairs per expert among pairs [lo, hi): int32 [BLOCK_E]."""
    counts = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for first in range(lo, hi, STEP):
        offs = first + tl.arange(0, STEP)
        ids = tl.load(ids_ptr + offs, mask=offs < hi, other=0).to(tl.int32)
        counts += tl.histogram(ids, BLOCK_E, mask=offs < hi)
    return counts


@triton.jit
def moe_count_kernel(
    ids_ptr, counts_ptr, num_pairs, pairs_per_program, BLOCK_E: tl.constexpr, STEP: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """counts [programs, BLOCK_E] int32: row i holds the per-expert counts of pairs range i."""
    pdl_wait(PDL)
    pid = tl.program_id(0)
    lo = pid * pairs_per_program
    counts = _histogram(ids_ptr, lo, tl.minimum(lo + pairs_per_program, num_pairs), BLOCK_E, STEP)
    tl.store(counts_ptr + pid * BLOCK_E + tl.arange(0, BLOCK_E), counts)


@triton.jit
def moe_align_kernel(
    ids_ptr, counts_ptr, sorted_ids_ptr, block_expert_ptr,
    num_pairs, num_experts, num_blocks, pairs_per_program, blocks_per_program, num_programs,
    COUNTED: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, STEP: tl.constexpr,
    COUNT_STEP: tl.constexpr, TILE: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Place pairs range program_id (module docstring, steps 1-3) and write its share of the blocks.

    ids [num_pairs] (any integer type): each pair's expert. counts [num_programs, BLOCK_E] int32:
    per-range counts (COUNTED; else one program counts all pairs itself). sorted_ids
    [num_blocks * BLOCK_M] and block_expert [num_blocks] int32, every entry written once."""
    pdl_wait(PDL)
    pid = tl.program_id(0)
    experts = tl.arange(0, BLOCK_E)
    if COUNTED:
        ROWS: tl.constexpr = TILE // BLOCK_E  # counts rows summed at once
        total = tl.zeros((BLOCK_E,), dtype=tl.int32)
        before = tl.zeros((BLOCK_E,), dtype=tl.int32)
        for row0 in range(0, num_programs, ROWS):
            rows = row0 + tl.arange(0, ROWS)
            tile = tl.load(counts_ptr + rows[:, None] * BLOCK_E + experts[None, :], mask=(rows < num_programs)[:, None])
            total += tl.sum(tile, axis=0)
            before += tl.sum(tl.where((rows < pid)[:, None], tile, 0), axis=0)
    else:
        total = _histogram(ids_ptr, 0, num_pairs, BLOCK_E, COUNT_STEP)
        before = tl.zeros((BLOCK_E,), dtype=tl.int32)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    segment_end = tl.cumsum(padded, axis=0)
    start = segment_end - padded

    # 2. the program's pairs, in order: a stable counting sort
    lo = pid * pairs_per_program
    hi = tl.minimum(lo + pairs_per_program, num_pairs)
    running = start + before
    steps = tl.arange(0, STEP)
    ids = tl.load(ids_ptr + lo + steps, mask=lo + steps < hi, other=0).to(tl.int32)
    for first in range(lo, hi, STEP):
        offs = first + steps
        in_range = offs < hi
        # the next STEP's ids, asked for before this one's work so that the load's latency overlaps it
        next_ids = tl.load(ids_ptr + offs + STEP, mask=offs + STEP < hi, other=0).to(tl.int32)
        earlier_same = (ids[:, None] == ids[None, :]) & (steps[None, :] < steps[:, None])
        dest = tl.gather(running, ids, 0) + tl.sum(earlier_same.to(tl.int32), axis=1)
        tl.store(sorted_ids_ptr + dest, offs, mask=in_range)
        running += tl.histogram(ids, BLOCK_E, mask=in_range)
        ids = next_ids

    # 3. the program's blocks: their experts, and padding wherever no pair was placed
    BLOCKS: tl.constexpr = TILE // BLOCK_E if BLOCK_E > BLOCK_M else TILE // BLOCK_M
    rows = tl.arange(0, BLOCK_M)
    pairs_end = start + total
    blo = pid * blocks_per_program
    bhi = tl.minimum(blo + blocks_per_program, num_blocks)
    for block0 in range(blo, bhi, BLOCKS):
        blocks = block0 + tl.arange(0, BLOCKS)
        first_row = blocks * BLOCK_M
        # experts whose segment ends after the block's first row; the first of them owns the block
        after = (experts < num_experts)[None, :] & (segment_end[None, :] > first_row[:, None])
        expert = num_experts - tl.sum(after.to(tl.int32), axis=1)
        owner_pairs_end = tl.min(tl.where(after, pairs_end[None, :], num_pairs + num_blocks * BLOCK_M), axis=1)
        real_end = tl.where(expert < num_experts, owner_pairs_end, first_row)  # unused blocks: all padding
        tl.store(block_expert_ptr + blocks, expert, mask=blocks < bhi)
        pad = (blocks < bhi)[:, None] & (first_row[:, None] + rows[None, :] >= real_end[:, None])
        tl.store(sorted_ids_ptr + first_row[:, None] + rows[None, :], num_pairs, mask=pad)


def _pairs_per_program(num_pairs: int) -> int:
    if num_pairs <= MAX_SINGLE_PAIRS:
        return max(num_pairs, 1)
    return max(MIN_PAIRS_PER_PROGRAM, triton.cdiv(triton.cdiv(num_pairs, MAX_PROGRAMS), STEP) * STEP)


def moe_align(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, *, pairs_per_program: int | None = None
) -> MoeAlignment:
    """topk_ids [T, k] (int32 expert ids) -> the pairs sorted by expert, each expert's segment padded
    to a multiple of block_m (module docstring). One launch up to MAX_SINGLE_PAIRS pairs, two above;
    `pairs_per_program` overrides the split (tests, sweeps)."""
    flat = topk_ids.reshape(-1).contiguous()  # a copy only for a strided view
    num_pairs = flat.numel()
    num_blocks = max_blocks(num_pairs, num_experts, block_m)
    device = topk_ids.device
    sorted_ids = torch.empty(num_blocks * block_m, dtype=torch.int32, device=device)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=device)
    per_program = pairs_per_program or _pairs_per_program(num_pairs)
    num_programs = max(1, triton.cdiv(num_pairs, per_program))
    block_e = triton.next_power_of_2(num_experts)
    counts = sorted_ids  # stands in when the one program counts itself (never read)
    if num_programs > 1:
        counts = torch.empty((num_programs, block_e), dtype=torch.int32, device=device)
        moe_count_kernel[(num_programs,)](
            flat,
            counts,
            num_pairs,
            per_program,
            BLOCK_E=block_e,
            STEP=COUNT_STEP,
            num_warps=RANGE_WARPS,
            **pdl_launch(),
        )
    moe_align_kernel[(num_programs,)](
        flat, counts, sorted_ids, block_expert,
        num_pairs, num_experts, num_blocks, per_program, triton.cdiv(num_blocks, num_programs), num_programs,
        COUNTED=num_programs > 1, BLOCK_E=block_e, BLOCK_M=block_m, STEP=STEP, COUNT_STEP=COUNT_STEP, TILE=TILE,
        num_warps=SINGLE_WARPS if num_programs == 1 else RANGE_WARPS, **pdl_launch(),
    )  # fmt: skip
    return MoeAlignment(sorted_ids, block_expert, num_pairs, num_blocks)
