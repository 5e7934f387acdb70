"""The MoE router's linear layer and routing in one kernel (kernels/moe_route.py's router_route) against the
reference (the linear layer's logits rounded to the activations' dtype, then moe_route), at ragged shapes:
several K steps with a ragged tail, experts spread over many programs, a padded expert row (130 experts in
256), with and without a bias; the arrival counter left at zero; the calls it declines."""

from __future__ import annotations

import pytest
import torch
from seeded import randn  # this folder (pytest puts it on sys.path)

from tritonllm import platform
from tritonllm.kernels import moe_route as mr
from tritonllm.kernels import reference
from tritonllm.kernels.launch import arrival_counters

DEVICE = platform.DEVICE


def _problem(t: int, e: int, h: int, seed: int, dtype: torch.dtype, bias: bool) -> tuple:
    x = randn(t, h, seed=seed, dtype=dtype)
    w = (randn(e, h, seed=seed + 1) * 2 * h**-0.5).to(dtype)  # logits ~ N(0, 4): distinct top-k
    return x, w, randn(e, seed=seed + 2, dtype=dtype) if bias else None


# (tokens, experts, hidden, top_k): one K step; 2880 (gpt-oss's hidden) in two steps of 2048 with a ragged tail;
# 130 experts (17 programs of 8, a 256-wide padded row) in three steps of 128; Qwen2-MoE's 60 experts
CASES = [(1, 6, 200, 2), (3, 32, 2880, 4), (8, 130, 300, 16), (5, 60, 96, 4)]


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("scoring, renormalize", [("softmax", True), ("softmax", False), ("sigmoid", True)])
@pytest.mark.parametrize("t, e, h, top_k", CASES)
def test_router_route_matches_reference(t, e, h, top_k, scoring, renormalize, bias) -> None:
    x, w, b = _problem(t, e, h, seed=t + e + h, dtype=platform.DEFAULT_DTYPE, bias=bias)
    weights, ids = mr.router_route(x, w, b, top_k, renormalize, scoring)
    ref_weights, ref_ids = reference.router_route(x, w, b, top_k, renormalize, scoring)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32 and ids.shape == (t, top_k)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-4, atol=1e-6)
    assert int(arrival_counters(x.device)[0]) == 0  # left ready for the next launch


def test_router_route_rounds_logits_to_the_activation_dtype() -> None:
    """float16 activations: the logits are the float16 linear layer's, as the unfused path gives them."""
    x, w, b = _problem(4, 32, 2880, seed=7, dtype=torch.float16, bias=True)
    weights, ids = mr.router_route(x, w, b, 4, True, "softmax")
    ref_weights, ref_ids = reference.router_route(x, w, b, 4, True, "softmax")
    assert torch.equal(ids, ref_ids)
    # a logit may round to the neighbouring float16 (summation order): a weight moves by about that much
    torch.testing.assert_close(weights, ref_weights, rtol=3e-3, atol=1e-4)


def test_router_route_uses_every_programs_logits() -> None:
    """The top experts sit in different programs' blocks (8 experts a program at 130 experts): the last
    program to arrive must route from all of them, and a second call (counter reset) routes again."""
    t, e, h = 2, 130, 64
    x = torch.ones(t, h, device=DEVICE, dtype=platform.DEFAULT_DTYPE)
    w = torch.zeros(e, h, device=DEVICE, dtype=platform.DEFAULT_DTYPE)
    top = [3, 57, 128, 90]  # in programs 0, 7, 16 (the last, partly padded) and 11
    for rank, expert in enumerate(top):
        w[expert] = (len(top) - rank) / h
    for _ in range(2):
        _, ids = mr.router_route(x, w, None, 4, True, "softmax")
        assert ids.tolist() == [top, top]


def test_router_route_declines_what_it_does_not_take() -> None:
    x, w, b = _problem(mr.ROUTER_MAX_TOKENS + 1, 8, 64, seed=0, dtype=platform.DEFAULT_DTYPE, bias=True)
    assert mr.router_route(x, w, b, 2, True, "softmax") is None  # a prefill: the router's GEMM
    x, w, b = _problem(2, 8, 64, seed=0, dtype=platform.DEFAULT_DTYPE, bias=True)
    assert mr.router_route(x, w.to(torch.float16), b, 2, True, "softmax") is None  # weight not in x's dtype
    assert mr.router_route(x[:, ::2], w[:, ::2], b, 2, True, "softmax") is None  # strided rows
    with pytest.raises(ValueError, match="top_k"):
        mr.router_route(x, w, b, 9, True, "softmax")
    with pytest.raises(ValueError, match="scoring"):
        mr.router_route(x, w, b, 2, True, "relu")


def test_router_tiles() -> None:
    assert mr.router_tiles(1, 32, 2880) == (1, 1, 4096)  # gpt-oss at batch 1: one K step, 32 programs
    assert mr.router_tiles(1, 128, 2048) == (1, 4, 2048)  # Qwen3-30B-A3B: 32 programs of 4 experts
    assert mr.router_tiles(8, 128, 2048) == (8, 4, 256)  # 8 x 4 x 256 products a step
    for t, e, k in [(1, 6, 200), (8, 130, 300), (5, 60, 96)]:
        block_t, experts, block_k = mr.router_tiles(t, e, k)
        assert block_t >= t and block_t * experts * block_k <= 8192 or block_k == 64
        assert block_k & (block_k - 1) == 0 and experts & (experts - 1) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not platform.is_gpu(), reason="bfloat16 at model shapes: the GPU")
@pytest.mark.parametrize("t, e, h, top_k", [(1, 32, 2880, 4), (4, 128, 2048, 8), (8, 8, 4096, 2), (3, 60, 2048, 4)])
def test_router_route_at_model_shapes_in_bfloat16(t, e, h, top_k) -> None:
    """gpt-oss-20b, Qwen3-30B-A3B, Mixtral and Qwen2-MoE router shapes in bfloat16. Logits a bfloat16 ulp apart
    may rank either way (summation order), so: every chosen expert's float32 logit is within two ulps of the
    k-th largest, and the weights are the reference's at the chosen experts."""
    x, w, b = _problem(t, e, h, seed=e + h, dtype=torch.bfloat16, bias=True)
    weights, ids = mr.router_route(x, w, b, top_k, True, "softmax")
    logits = torch.nn.functional.linear(x.float(), w.float(), b.float())
    kth = logits.topk(top_k, dim=-1).values[:, -1:]
    ulp = 2 * logits.abs().amax(-1, keepdim=True) * 2.0**-7
    assert (logits.gather(1, ids.long()) >= kth - ulp).all()
    assert all(len(set(row)) == top_k for row in ids.tolist())
    chosen = logits.to(torch.bfloat16).float().gather(1, ids.long()).softmax(-1)  # renormalized softmax at the ids
    torch.testing.assert_close(weights, chosen, rtol=2e-2, atol=1e-3)
