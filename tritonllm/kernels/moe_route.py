"""The MoE router's Triton kernel: per token, score the experts and keep the top k (the `moe` op's
`moe_route`; kernels/reference.py's `moe_route` defines it).

A program takes ROWS tokens' logits [ROWS, E] (E padded to a power of two, the padding scored
below any real score), scores them (softmax over the experts, or a sigmoid each) in float32, then
takes the top k one at a time: the largest score, the lowest expert id among those equal to it
(ties go to the lower id), which is then struck out. k is small (at most 16) and unrolled. The
weights are divided by their sum when `renormalize`. No host synchronisation: capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonllm import platform
from tritonllm.kernels.launch import pdl_launch, pdl_wait
from tritonllm.kernels.reference import MOE_SCORINGS
from tritonllm.kernels.registry import register

MAX_TOP_K = 16


@triton.jit
def moe_route_kernel(
    logits_ptr, weights_ptr, ids_ptr, T, E, stride_lt, stride_le,
    TOP_K: tl.constexpr, SCORING: tl.constexpr, RENORMALIZE: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_wait(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    experts = tl.arange(0, BLOCK_E)
    in_rows = rows < T
    mask = in_rows[:, None] & (experts < E)[None, :]
    ptrs = logits_ptr + rows[:, None].to(tl.int64) * stride_lt + experts[None, :] * stride_le
    logits = tl.load(ptrs, mask=mask, other=-float("inf")).to(tl.float32)
    logits = tl.where(in_rows[:, None], logits, 0.0)  # rows past T: finite (never stored)
    if SCORING == 0:  # softmax
        p = tl.exp(logits - tl.max(logits, axis=1)[:, None])
        scores = p / tl.sum(p, axis=1)[:, None]
    else:  # sigmoid
        scores = 1.0 / (1.0 + tl.exp(-logits))
    scores = tl.where(mask, scores, -1.0)  # below every real score (all >= 0)
    slots = tl.arange(0, BLOCK_K)
    weights = tl.zeros((ROWS, BLOCK_K), dtype=tl.float32)
    ids = tl.zeros((ROWS, BLOCK_K), dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(scores, axis=1)
        best_id = tl.min(tl.where(scores == best[:, None], experts[None, :], BLOCK_E), axis=1)
        weights = tl.where(slots[None, :] == j, best[:, None], weights)
        ids = tl.where(slots[None, :] == j, best_id[:, None], ids)
        scores = tl.where(experts[None, :] == best_id[:, None], -2.0, scores)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, axis=1)[:, None]
    out_mask = in_rows[:, None] & (slots < TOP_K)[None, :]
    out_offs = rows[:, None].to(tl.int64) * TOP_K + slots[None, :]
    tl.store(weights_ptr + out_offs, weights, mask=out_mask)
    tl.store(ids_ptr + out_offs, ids, mask=out_mask)


@register("moe", "triton")
def moe_route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, scoring: str = "softmax"
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights float32 [T, top_k], expert ids int32 [T, top_k])."""
    if scoring not in MOE_SCORINGS:
        raise ValueError(f"MoE scoring {scoring!r} is not one of {MOE_SCORINGS}")
    t, e = router_logits.shape
    if not 0 < top_k <= min(e, MAX_TOP_K):
        raise ValueError(f"moe_route: top_k {top_k} must be in 1..{min(e, MAX_TOP_K)} ({e} experts)")
    weights = torch.empty((t, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=router_logits.device)
    if t == 0:
        return weights, ids
    block_e = triton.next_power_of_2(e)
    # a few rows a program: keeps a row's scores in registers (E <= 256) while amortising the launch;
    # the interpreter runs a program's rows as one numpy operation, so it takes many
    rows = max(1, min(16 if platform.is_interpreter() else 4096 // block_e, triton.next_power_of_2(t)))
    moe_route_kernel[(triton.cdiv(t, rows),)](
        router_logits, weights, ids, t, e, router_logits.stride(0), router_logits.stride(1),
        TOP_K=top_k, SCORING=MOE_SCORINGS.index(scoring), RENORMALIZE=renormalize,
        ROWS=rows, BLOCK_E=block_e, BLOCK_K=triton.next_power_of_2(top_k), num_warps=4, **pdl_launch(),
    )  # fmt: skip
    return weights, ids
