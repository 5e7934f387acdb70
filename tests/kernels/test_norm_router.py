"""The decoder layer's residual add and RMSNorm folded into the MoE router's launch (kernels/moe_route.py's
norm_router_route) against the norm kernel then router_route (bit for bit: the same sums, the same rounding),
and against the torch reference (fused_add_rms_norm, then the router's linear layer and moe_route): one and two
tokens, hidden sizes of one and several K steps with a ragged tail, experts over many programs; negative checks
(a residual left out, a norm weight scaled) and the calls it declines."""

from __future__ import annotations

import pytest
import torch
from seeded import randn  # this folder (pytest puts it on sys.path)

from tritonllm import platform
from tritonllm.kernels import moe_route as mr
from tritonllm.kernels import reference
from tritonllm.kernels.launch import arrival_counters
from tritonllm.kernels.rmsnorm import fused_add_rms_norm

DTYPE = platform.DEFAULT_DTYPE


def _problem(t: int, e: int, h: int, seed: int, dtype: torch.dtype = DTYPE, bias: bool = True) -> tuple:
    x = randn(t, h, seed=seed, dtype=dtype)  # the attention's output
    residual = (randn(t, h, seed=seed + 1) * 3).to(dtype)
    norm_w = (1 + 0.5 * randn(h, seed=seed + 2)).to(dtype)
    w = (randn(e, h, seed=seed + 3) * 2 * h**-0.5).to(dtype)  # logits ~ N(0, 4): distinct top-k
    return x, residual, norm_w, w, randn(e, seed=seed + 4, dtype=dtype) if bias else None


# (tokens, experts, hidden, top_k): gpt-oss's router at one token (one K step of 4096 for 2880), Qwen3-30B-A3B's
# (four experts a program), 130 experts (a padded row) over several K steps, a ragged hidden size
CASES = [(1, 32, 2880, 4), (2, 128, 2048, 8), (2, 130, 300, 16), (1, 6, 200, 2)]


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("t, e, h, top_k", CASES)
def test_norm_router_route_matches_the_unfused_kernels(t, e, h, top_k, bias) -> None:
    x, residual, norm_w, w, b = _problem(t, e, h, seed=t + e + h, bias=bias)
    weights, ids, normed, res_out = mr.norm_router_route(x, residual, norm_w, 1e-5, w, b, top_k, True)
    ref_normed, ref_res = fused_add_rms_norm(x, residual, norm_w, 1e-5)
    ref_weights, ref_ids = mr.router_route(ref_normed, w, b, top_k, True)
    assert torch.equal(res_out, ref_res) and torch.equal(normed, ref_normed)
    assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_weights)
    assert int(arrival_counters(x.device)[0]) == 0
    # and the torch reference of the whole (the norm, the linear layer's logits, moe_route)
    r_weights, r_ids, r_normed, r_res = reference.norm_router_route(x, residual, norm_w, 1e-5, w, b, top_k, True)
    assert torch.equal(ids, r_ids) and torch.equal(res_out, r_res)
    scale = r_normed.float().abs().amax()
    assert (normed.float() - r_normed.float()).abs().amax() <= 1e-5 * scale
    torch.testing.assert_close(weights, r_weights, rtol=1e-4, atol=1e-6)


def test_norm_router_route_catches_a_wrong_norm() -> None:
    """What the experts read is the normalized sum: a residual left out, or the norm's weight scaled by 1.01, is
    caught by the comparison above (the normalized rows differ past the tolerance)."""
    x, residual, norm_w, w, b = _problem(1, 32, 2880, seed=3)
    _, _, normed, _ = mr.norm_router_route(x, residual, norm_w, 1e-5, w, b, 4, True)
    for wrong in (reference.rms_norm(x, norm_w, 1e-5), fused_add_rms_norm(x, residual, norm_w * 1.01, 1e-5)[0]):
        assert (normed.float() - wrong.float()).abs().amax() > 1e-3 * wrong.float().abs().amax()


def test_norm_router_route_in_float16() -> None:
    x, residual, norm_w, w, b = _problem(2, 32, 2880, seed=5, dtype=torch.float16)
    weights, ids, normed, res_out = mr.norm_router_route(x, residual, norm_w, 1e-6, w, b, 4, True)
    ref_normed, ref_res = fused_add_rms_norm(x, residual, norm_w, 1e-6)
    assert torch.equal(res_out, ref_res) and torch.equal(normed, ref_normed)
    ref_weights, ref_ids = mr.router_route(ref_normed, w, b, 4, True)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-3, atol=1e-5)


def test_norm_router_route_declines_what_it_does_not_take() -> None:
    x, residual, norm_w, w, b = _problem(mr.NORM_ROUTER_MAX_TOKENS + 1, 8, 64, seed=0)
    assert mr.norm_router_route(x, residual, norm_w, 1e-5, w, b, 2, True) is None  # past two tokens
    x, residual, norm_w, w, b = _problem(2, 8, 64, seed=0)
    assert mr.norm_router_route(x, residual.to(torch.float16), norm_w, 1e-5, w, b, 2, True) is None
    assert mr.norm_router_route(x, residual, norm_w[:32], 1e-5, w, b, 2, True) is None
    assert mr.norm_router_route(x, residual, norm_w, 1e-5, w.to(torch.float16), b, 2, True) is None  # router_route's


@pytest.mark.gpu
@pytest.mark.skipif(not platform.is_gpu(), reason="bfloat16 at model shapes: the GPU")
@pytest.mark.parametrize("t, e, h, top_k", [(1, 32, 2880, 4), (2, 128, 2048, 8), (1, 8, 4096, 2), (2, 60, 2048, 4)])
def test_norm_router_route_at_model_shapes_in_bfloat16(t, e, h, top_k) -> None:
    """gpt-oss-20b, Qwen3-30B-A3B, Mixtral and Qwen2-MoE shapes in bfloat16 (CUDA: reductions may sum in another
    order than the norm kernel's): the residual sum exact, the normalized rows within a bfloat16 ulp of the norm
    kernel's, every chosen expert's logit within two ulps of the k-th largest, the counter back at zero."""
    x, residual, norm_w, w, b = _problem(t, e, h, seed=e + h, dtype=torch.bfloat16)
    weights, ids, normed, res_out = mr.norm_router_route(x, residual, norm_w, 1e-5, w, b, top_k, True)
    ref_normed, ref_res = fused_add_rms_norm(x, residual, norm_w, 1e-5)
    assert torch.equal(res_out, ref_res)
    assert ((normed.float() - ref_normed.float()).abs() <= ref_normed.float().abs() * 2.0**-7 + 1e-6).all()
    logits = torch.nn.functional.linear(ref_normed.float(), w.float(), b.float())
    kth = logits.topk(top_k, dim=-1).values[:, -1:]
    ulp = 2 * logits.abs().amax(-1, keepdim=True) * 2.0**-7
    assert (logits.gather(1, ids.long()) >= kth - ulp).all()
    assert all(len(set(row)) == top_k for row in ids.tolist())
    chosen = logits.to(torch.bfloat16).float().gather(1, ids.long()).softmax(-1)
    torch.testing.assert_close(weights, chosen, rtol=2e-2, atol=1e-3)
    assert int(arrival_counters(x.device)[0]) == 0
