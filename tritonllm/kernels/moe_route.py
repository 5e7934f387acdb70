"""The MoE router's Triton kernel: per token, score the experts and keep the top k (the `moe` op's
`moe_route`; kernels/reference.py's `moe_route` defines it).

A program takes ROWS tokens' logits [ROWS, E] (E padded to a power of two, the padding scored
below any real score), scores them (softmax over the experts, or a sigmoid each) in float32, then
takes the top k one at a time: the largest score, the lowest expert id among those equal to it
(ties go to the lower id), which is then struck out. k is small (at most 16) and unrolled. Each pick
is one max over keys that hold a score's bits above its id's complement, and a program holds at least
a row a warp, so each pick is a reduction within a warp (a token's row across four warps took two
cross-warp reductions a pick: the fused kernel's sm90 build at Qwen3-30B-A3B's top-8 of 128 held 61
barriers, now 11, none of them in the picks). The weights are divided by their sum when
`renormalize`. No host synchronisation: capturable.

At decode sizes the router's linear layer and the routing are one kernel (`router_route`, the op's
optional entry; EngineConfig.fuse_moe_router): each program computes a few experts' logits for every
token (the router's weight read once, spread over the programs), stores them as float32 rounded to the
activations' dtype (as the linear layer's output is), and the last program to arrive (an arrival
counter, launch.arrival_counters) routes every token. One launch where the unfused path takes the
router's GEMM (cuBLAS: a GEMV and often a split-K reduction kernel) and the routing kernel.
`norm_router_route` (EngineConfig.fuse_norm_into_router) takes the decoder layer's residual add and RMSNorm
before the block into the same launch: the norm kernel's launch saved at one or two tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonllm import platform
from tritonllm.kernels.launch import arrival_counters, pdl_launch, pdl_wait
from tritonllm.kernels.reference import MOE_SCORINGS
from tritonllm.kernels.registry import register

MAX_TOP_K = 16
# router_route: tokens it takes (more: the router's GEMM, then moe_route), experts it scores
ROUTER_MAX_TOKENS = 8
ROUTER_MAX_EXPERTS = 256
# the tokens up to which fuse_moe_router takes router_route (layers/moe.py): on the H100 (session 29, bench_moe,
# graph replay, bf16, against cuBLAS's GEMV with bias and moe_route) 8.4 against 11.4 us at gpt-oss's router
# (32 x 2880) and 11.3 against 12.7 us at Qwen3-30B-A3B's (128 x 2048) at 1 token; at 4 tokens 11.4 against
# 12.6 and 16.4 against 11.6, at 8 tokens 16.9 against 12.4 and 24.3 against 12.0 (each program's K loop and
# the last program's top-k grow with the tokens); at 2 tokens (a later call) 9.7 against 12.6 (gpt-oss) but 13.5
# against 13.1 us (Qwen3). With the picks within a warp (session 50, an H100, experiments/moe/README.md): fused
# against unfused at 1 / 2 / 4 tokens 8.2 / 9.1 / 11.1 against 11.2 / 11.8 / 12.1 us (gpt-oss), 9.6 / 10.9 / 14.0
# against 12.3 / 12.3 / 12.4 us (Qwen3; the fused one was 10.5-10.8 at one token before): both win at 2 now
FUSED_ROUTER_TOKENS = 2
# norm_router_route: tokens it takes (a program holds each token's whole row for the norm's sum)
NORM_ROUTER_MAX_TOKENS = 2
# its warps: the norm's operands beside the router's weight at one K step of the whole row (gpt-oss: 4,096 columns)
# spill on four warps' registers (sm90 builds, scripts/cross_compile_moe.py)
NORM_ROUTER_WARPS = 8
ROUTER_WARPS = 4  # both routing kernels'


@triton.jit
def _route_rows(logits, rows, in_rows, experts, E, weights_ptr, ids_ptr, TOP_K: tl.constexpr, SCORING: tl.constexpr,
                RENORMALIZE: tl.constexpr, SLOTS: tl.constexpr):  # fmt: skip
    """Score the float32 logits [ROWS, BLOCK_E] (experts past E, and rows not in_rows, any finite value)
    and store each row's top-k weights and expert ids (SLOTS: TOP_K rounded up to a power of two)."""
    mask = in_rows[:, None] & (experts < E)[None, :]
    logits = tl.where(mask, logits, -float("inf"))
    logits = tl.where(in_rows[:, None], logits, 0.0)  # rows past T: finite (never stored)
    if SCORING == 0:  # softmax
        p = tl.exp(logits - tl.max(logits, axis=1)[:, None])
        scores = p / tl.sum(p, axis=1)[:, None]
    else:  # sigmoid
        scores = 1.0 / (1.0 + tl.exp(-logits))
    scores = tl.where(mask, scores, -1.0)  # below every real score (all >= 0)
    # one key a score: its float32 bits above the expert id's complement, so that one max picks the largest
    # score and, among equal ones, the lowest id (scores are >= 0, whose bits order as integers do; the
    # padding's -1 gives a negative key); keys are distinct, so the chosen one is struck out by equality
    low = logits.shape[1] - 1 - experts[None, :]
    keys = (scores.to(tl.int32, bitcast=True).to(tl.int64) << 32) | low.to(tl.int64)
    slots = tl.arange(0, SLOTS)
    weights = tl.zeros((logits.shape[0], SLOTS), dtype=tl.float32)
    ids = tl.zeros((logits.shape[0], SLOTS), dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(keys, axis=1)
        best_score = (best >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        best_id = logits.shape[1] - 1 - (best & 0xFFFFFFFF).to(tl.int32)
        weights = tl.where(slots[None, :] == j, best_score[:, None], weights)
        ids = tl.where(slots[None, :] == j, best_id[:, None], ids)
        keys = tl.where(keys == best[:, None], -(1 << 62), keys)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, axis=1)[:, None]
    out_mask = in_rows[:, None] & (slots < TOP_K)[None, :]
    out_offs = rows[:, None].to(tl.int64) * TOP_K + slots[None, :]
    tl.store(weights_ptr + out_offs, weights, mask=out_mask)
    tl.store(ids_ptr + out_offs, ids, mask=out_mask)


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
    logits = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    _route_rows(logits, rows, in_rows, experts, E, weights_ptr, ids_ptr, TOP_K, SCORING, RENORMALIZE, BLOCK_K)


@triton.jit
def _residual_rstd(x_ptr, res_ptr, norm_w_ptr, normed_ptr, res_out_ptr, tokens, t_in, K, stride_xt, stride_rt, eps,
                   BLOCK_H: tl.constexpr):  # fmt: skip
    """The 1 / RMS [BLOCK_T] of each token's residual sum x + res (rounded to x's dtype), as _rms_norm_kernel
    computes it (the whole row one tile); program 0 stores the sums and their normalized rows (weight norm_w_ptr)."""
    cols = tl.arange(0, BLOCK_H)
    mask = t_in[:, None] & (cols < K)[None, :]
    rows = tokens.to(tl.int64)[:, None]
    x = tl.load(x_ptr + rows * stride_xt + cols[None, :], mask=mask, other=0.0)
    res = tl.load(res_ptr + rows * stride_rt + cols[None, :], mask=mask, other=0.0)
    x = (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / K + eps)
    if tl.program_id(0) == 0:
        w = tl.load(norm_w_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
        out = xf * rstd[:, None] * w[None, :]
        tl.store(res_out_ptr + rows * K + cols[None, :], x, mask=mask)
        tl.store(normed_ptr + rows * K + cols[None, :], out.to(normed_ptr.dtype.element_ty), mask=mask)
    return rstd


@triton.jit
def router_route_kernel(
    x_ptr, w_ptr, bias_ptr, logits_ptr, weights_ptr, ids_ptr, counter_ptr, T, E, K, stride_xt, stride_we,
    res_ptr, norm_w_ptr, normed_ptr, res_out_ptr, stride_rt, eps,
    TOP_K: tl.constexpr, SCORING: tl.constexpr, RENORMALIZE: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_T: tl.constexpr, EXPERTS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
    SLOTS: tl.constexpr, ROUTE_T: tl.constexpr, NORM: tl.constexpr = False, BLOCK_H: tl.constexpr = 1,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """logits[t, e] = x[t] . w[e] (+ bias[e]) for every token t < T (<= BLOCK_T) and this program's EXPERTS
    experts, summed in float32 and rounded to x's dtype (the router linear's output), stored in the float32
    workspace logits [T, E]; the last program to arrive on counter_ptr routes every token (_route_rows) and
    leaves the counter at zero. Both operands are loaded as the product's [BLOCK_T, EXPERTS, BLOCK_K] tile (each
    token's row once an expert, each expert's row once a token: repeats served by L1), so the product needs no
    layout change. The weight and bias (no kernel writes them) are loaded a K step ahead, the first before
    the PDL wait, so that they stream while the kernel before drains (at decode the whole row is one step).
    NORM (norm_router_route): x is the residual add + RMSNorm of x_ptr's rows (the attention's output) and res_ptr's
    (the residual stream) with weight norm_w_ptr [K], computed as the norm kernel (kernels/rmsnorm.py) computes it:
    the sum rounded to x's dtype, its 1 / RMS over the whole row [BLOCK_T, BLOCK_H], the product rounded; every
    program normalizes its own K steps, and program 0 also stores the sum (res_out_ptr) and the normalized rows
    (normed_ptr), [T, K] contiguous, for the layer's experts and the next layer."""
    tokens = tl.arange(0, BLOCK_T)
    experts = tl.program_id(0) * EXPERTS + tl.arange(0, EXPERTS)
    t_in = tokens < T
    e_in = experts < E
    offs_k = tl.arange(0, BLOCK_K)[None, None, :]
    zero_t = (tokens * 0)[:, None, None]
    zero_e = (experts * 0)[None, :, None]
    w_ptrs = w_ptr + (tl.where(e_in, experts, 0)[None, :, None].to(tl.int64) * stride_we + zero_t) + offs_k
    w = tl.load(w_ptrs, mask=(zero_t == 0) & (offs_k < K), other=0.0)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + experts, mask=e_in, other=0.0)
    pdl_wait(PDL)
    x_ptrs = x_ptr + (tokens[:, None, None].to(tl.int64) * stride_xt + zero_e) + offs_k
    x_rows = t_in[:, None, None] & (zero_e == 0)
    if NORM:
        rstd = _residual_rstd(x_ptr, res_ptr, norm_w_ptr, normed_ptr, res_out_ptr, tokens, t_in, K, stride_xt,
                              stride_rt, eps, BLOCK_H)  # fmt: skip
        r_ptrs = res_ptr + (tokens[:, None, None].to(tl.int64) * stride_rt + zero_e) + offs_k
    acc = tl.zeros((BLOCK_T, EXPERTS), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        k_in = x_rows & (k + offs_k < K)
        if NORM:  # the norm's values, as _residual_rstd's program 0 stores them
            x = tl.load(x_ptrs + k, mask=k_in, other=0.0)
            s = (x.to(tl.float32) + tl.load(r_ptrs + k, mask=k_in, other=0.0).to(tl.float32)).to(x.dtype)
            nw = tl.load(norm_w_ptr + k + offs_k, mask=k + offs_k < K, other=0.0).to(tl.float32)
            x = (s.to(tl.float32) * rstd[:, None, None] * nw).to(x.dtype).to(tl.float32)
        else:
            x = tl.load(x_ptrs + k, mask=k_in, other=0.0).to(tl.float32)
        acc += tl.sum(x * w.to(tl.float32), axis=2)
        k_next = k + BLOCK_K  # the next step's weight
        w = tl.load(w_ptrs + k_next, mask=(zero_t == 0) & (k_next + offs_k < K), other=0.0)
    if HAS_BIAS:
        acc += bias.to(tl.float32)[None, :]
    logits = acc.to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(logits_ptr + tokens[:, None] * E + experts[None, :], logits, mask=t_in[:, None] & e_in[None, :])
    tl.debug_barrier()  # every thread's logits stored before the (releasing) arrival
    if tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        # ROUTE_T (>= the warps) rows, those past T masked: a row a warp, so the top-k's reductions stay
        # within a warp (shuffles, no barrier); one row would spread over every warp
        rows = tl.arange(0, ROUTE_T)
        r_in = rows < T
        every = tl.arange(0, BLOCK_E)
        ptrs = logits_ptr + rows[:, None] * E + every[None, :]
        all_logits = tl.load(ptrs, mask=r_in[:, None] & (every < E)[None, :], other=0.0, cache_modifier=".cg")
        _route_rows(all_logits, rows, r_in, every, E, weights_ptr, ids_ptr, TOP_K, SCORING, RENORMALIZE, SLOTS)
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")  # ready for the next launch


def _check_route(experts: int, top_k: int, scoring: str) -> None:
    if scoring not in MOE_SCORINGS:
        raise ValueError(f"MoE scoring {scoring!r} is not one of {MOE_SCORINGS}")
    if not 0 < top_k <= min(experts, MAX_TOP_K):
        raise ValueError(f"moe_route: top_k {top_k} must be in 1..{min(experts, MAX_TOP_K)} ({experts} experts)")


def _route_outputs(t: int, top_k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    weights = torch.empty((t, top_k), dtype=torch.float32, device=device)
    return weights, torch.empty((t, top_k), dtype=torch.int32, device=device)


@register("moe", "triton")
def moe_route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, scoring: str = "softmax"
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights float32 [T, top_k], expert ids int32 [T, top_k])."""
    t, e = router_logits.shape
    _check_route(e, top_k, scoring)
    weights, ids = _route_outputs(t, top_k, router_logits.device)
    if t == 0:
        return weights, ids
    block_e = triton.next_power_of_2(e)
    # a few rows a program: keeps a row's scores in registers (E <= 256) while amortising the launch, and
    # at least a row a warp (those past T masked), so the top-k's reductions stay within a warp; the
    # interpreter runs a program's rows as one numpy operation, so it takes many
    rows = max(ROUTER_WARPS, min(16 if platform.is_interpreter() else 4096 // block_e, triton.next_power_of_2(t)))
    moe_route_kernel[(triton.cdiv(t, rows),)](
        router_logits, weights, ids, t, e, router_logits.stride(0), router_logits.stride(1),
        TOP_K=top_k, SCORING=MOE_SCORINGS.index(scoring), RENORMALIZE=renormalize,
        ROWS=rows, BLOCK_E=block_e, BLOCK_K=triton.next_power_of_2(top_k), num_warps=ROUTER_WARPS, **pdl_launch(),
    )  # fmt: skip
    return weights, ids


def router_tiles(t: int, e: int, k: int) -> tuple[int, int, int]:
    """router_route_kernel's (BLOCK_T, experts a program, BLOCK_K): about 32 programs, so the router's weight
    is read by that many SMs at once, and at most 8192 float32 products a K step (64 a thread of four warps)."""
    block_t = triton.next_power_of_2(t)
    experts = max(1, triton.next_power_of_2(e) // 32)
    largest = 1 << max(6, (8192 // (block_t * experts)).bit_length() - 1)  # a power of two, at least 64
    return block_t, experts, min(triton.next_power_of_2(k), largest)


@register("moe", "triton")
def router_route(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, top_k: int, renormalize: bool,
    scoring: str = "softmax",
) -> tuple[torch.Tensor, torch.Tensor] | None:  # fmt: skip
    """The router's linear layer (x [T, H] times weight [E, H], plus bias [E]) and moe_route in one launch:
    moe_route's (weights, ids) of the logits as the linear layer would give them (rounded to x's dtype).
    None where the kernel does not take the call: more than ROUTER_MAX_TOKENS tokens (a prefill: the GEMM
    pays there) or ROUTER_MAX_EXPERTS experts, a weight not in x's dtype, rows not contiguous, or no
    arrival counters (a graph captured before they exist); the caller then runs the layer and moe_route."""
    return _router_launch(x, weight, bias, top_k, renormalize, scoring, None)


@register("moe", "triton")
def norm_router_route(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
    bias: torch.Tensor | None, top_k: int, renormalize: bool, scoring: str = "softmax",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:  # fmt: skip
    """The decoder layer's residual add and RMSNorm before a MoE block, then router_route, in one launch:
    (weights, ids, the normalized rows, the new residual x + residual), each as the norm kernel
    (fused_add_rms_norm) and router_route would give them. x [T, H] the attention's output, residual [T, H], norm_weight
    [H]. None where router_route declines, past NORM_ROUTER_MAX_TOKENS tokens (each program holds its tokens'
    whole rows), or where residual / norm_weight are not x's dtype and contiguous rows: the caller then runs the norm
    kernel and router_route (or the router's GEMM)."""
    t, h = x.shape
    if t > NORM_ROUTER_MAX_TOKENS or residual.shape != x.shape or norm_weight.shape != (h,):
        return None
    if (
        residual.dtype != x.dtype
        or norm_weight.dtype != x.dtype
        or residual.stride(1) != 1
        or norm_weight.stride(0) != 1
    ):
        return None
    normed, res_out = torch.empty_like(x), torch.empty_like(x)
    route = _router_launch(x, weight, bias, top_k, renormalize, scoring, (residual, norm_weight, normed, res_out, eps))
    return None if route is None else (*route, normed, res_out)


def _router_launch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, top_k: int, renormalize: bool, scoring: str,
    norm: tuple | None,
) -> tuple[torch.Tensor, torch.Tensor] | None:  # fmt: skip
    """router_route_kernel's launch (router_route's contract); norm: (residual, norm weight, normed out, residual
    out, eps) for NORM."""
    t, k = x.shape
    e = weight.shape[0]
    _check_route(e, top_k, scoring)
    plain = isinstance(weight, torch.Tensor) and weight.dtype == x.dtype and weight.shape[1] == k
    if not (0 < t <= ROUTER_MAX_TOKENS and e <= ROUTER_MAX_EXPERTS and plain):
        return None
    if x.stride(1) != 1 or weight.stride(1) != 1 or (bias is not None and bias.stride(0) != 1):
        return None
    counters = arrival_counters(x.device)
    if counters is None:
        return None
    block_t, experts, block_k = router_tiles(t, e, k)
    logits = torch.empty((t, e), dtype=torch.float32, device=x.device)
    weights, ids = _route_outputs(t, top_k, x.device)
    residual, norm_weight, normed, res_out, eps = norm if norm is not None else (x, x, x, x, 0.0)
    warps = ROUTER_WARPS if norm is None else NORM_ROUTER_WARPS
    router_route_kernel[(triton.cdiv(e, experts),)](
        x, weight, bias if bias is not None else weight, logits, weights, ids, counters, t, e, k, x.stride(0),
        weight.stride(0), residual, norm_weight, normed, res_out, residual.stride(0), eps, TOP_K=top_k,
        SCORING=MOE_SCORINGS.index(scoring), RENORMALIZE=renormalize, HAS_BIAS=bias is not None, BLOCK_T=block_t,
        EXPERTS=experts, BLOCK_K=block_k, BLOCK_E=triton.next_power_of_2(e), SLOTS=triton.next_power_of_2(top_k),
        ROUTE_T=max(block_t, warps), NORM=norm is not None, BLOCK_H=triton.next_power_of_2(k) if norm else 1,
        num_warps=warps, **pdl_launch(),
    )  # fmt: skip
    return weights, ids
