"""Alignment of a batch's (token, slot) pairs to the fused-MoE GEMM's row blocks, on the device.

The T * k pairs (pair p = t * k + j: token t's j-th expert topk_ids[t, j]) are sorted by expert,
each expert's segment padded to a multiple of BLOCK_M, so that every BLOCK_M rows of the sorted
list belong to one expert: the grouped GEMM (kernels/moe.py) takes one block per program row, its
expert from `block_expert`. Sizes are static upper bounds, T * k + E * (BLOCK_M - 1) entries
rounded up to whole blocks, so the GEMM's grid depends on T, k, E and BLOCK_M only: no host
synchronisation, and a decode step's launches can be captured in a CUDA graph. Padding entries hold
T * k (masked by the GEMM); blocks past the last expert's segment hold expert E (skipped).

Written with torch ops that never read sizes back to the host (a scatter-add histogram, cumsums, a
stable sort, searchsorted: no .item(), nonzero, boolean indexing or bincount): about ten small
launches, which a CUDA graph replays at no host cost. The sort keeps each expert's pairs in token
order, so the result (and the GEMM's) is deterministic.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton


class MoeAlignment(NamedTuple):
    sorted_ids: torch.Tensor  # int32 [num_blocks * BLOCK_M]: pair ids by expert, padded with T * k
    block_expert: torch.Tensor  # int32 [num_blocks]: each block's expert (E: an unused block)
    num_pairs: int  # T * k
    num_blocks: int  # the static bound: cdiv(T * k + E * (BLOCK_M - 1), BLOCK_M)


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Blocks of BLOCK_M rows that any routing of num_pairs pairs over num_experts experts may need."""
    return triton.cdiv(num_pairs + num_experts * (block_m - 1), block_m)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoeAlignment:
    """topk_ids [T, k] (int32 expert ids) -> the pairs sorted by expert, each expert's segment padded
    to a multiple of block_m (module docstring)."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1)
    num_pairs = flat.numel()
    num_blocks = max_blocks(num_pairs, num_experts, block_m)
    experts = flat.long()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, experts, torch.ones_like(experts))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    first_of_expert = torch.cumsum(counts, 0) - counts  # where each expert's pairs start once sorted
    sorted_experts, order = torch.sort(experts, stable=True)
    rank = torch.arange(num_pairs, device=device) - first_of_expert[sorted_experts]
    dest = padded_end[sorted_experts] - padded[sorted_experts] + rank
    sorted_ids = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(num_blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, block_start, right=True).to(torch.int32)
    return MoeAlignment(sorted_ids, block_expert, num_pairs, num_blocks)
