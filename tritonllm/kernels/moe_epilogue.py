"""The fused-MoE kernels' shared epilogue (kernels/moe.py's grouped GEMM, kernels/moe_gemv.py's GEMV):
expert bias, the gated activation, the pair's top-k weight, and the store of each pair's row."""

from __future__ import annotations

import math

import triton
import triton.language as tl

from tritonllm import platform  # noqa: F401  (switches on the interpreter on CPU first)


@triton.jit
def moe_activation(gate, up, alpha, limit, ACTIVATION: tl.constexpr):
    """0: silu(gate) * up; 1: gpt-oss's (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)."""
    if ACTIVATION == 0:
        out = gate / (1.0 + tl.exp(-gate)) * up
    else:
        g = tl.minimum(gate, limit)
        out = (tl.minimum(tl.maximum(up, -limit), limit) + 1.0) * g / (1.0 + tl.exp(-alpha * g))
    return out


def activation_bound(activation: str, alpha: float, limit: float) -> float:
    """A bound on |moe_activation(gate, up)| over every input, or 0 where there is none (silu). gpt-oss's
    (swiglu_oai): |clamp(up) + 1| <= limit + 1, and g sigmoid(alpha g), increasing for g > 0, with g <= limit lies
    in [-0.2785 / alpha, limit sigmoid(alpha limit)] (its minimum over g < 0 is at alpha g = -1.2785); 1% above
    that for the bf16 rounding of the stored result."""
    if activation != "swiglu_oai" or not (alpha > 0.0 and limit > 0.0):
        return 0.0
    return 1.01 * (limit + 1.0) * max(limit / (1.0 + math.exp(-alpha * limit)), 0.2785 / alpha)


@triton.jit
def moe_store(acc, acc_up, c_ptr, bias_ptr, topk_weights_ptr, pair, valid, e, rn, offs_n, N, alpha, limit,
              stride_cm, stride_cn, stride_bias_e, GATED: tl.constexpr, ACTIVATION: tl.constexpr,
              HAS_BIAS: tl.constexpr, MUL_WEIGHTS: tl.constexpr, SUM_TO=None):  # fmt: skip
    """c[pair, offs_n] for the [rows, BLOCK_N] float32 accumulators of rows `pair` (those `valid`):
    + the expert's bias (gate and up rows: N apart), the activation when GATED, x the pair's top-k
    weight when MUL_WEIGHTS; stored in c's dtype. `e`: the rows' expert, one for all (a scalar) or
    each row's ([rows, 1]). SUM_TO (a [1] row index): the valid rows summed and stored at that row
    of c instead (a token's top-k slots, kernels/moe_gemv.py)."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + e * stride_bias_e + rn[None, :]).to(tl.float32)
        if GATED:
            acc_up += tl.load(bias_ptr + e * stride_bias_e + N + rn[None, :]).to(tl.float32)
    if GATED:
        acc = moe_activation(acc, acc_up, alpha, limit, ACTIVATION)
    if MUL_WEIGHTS:
        acc = acc * tl.load(topk_weights_ptr + pair, mask=valid, other=0.0)[:, None]
    if SUM_TO is not None:
        acc = tl.sum(tl.where(valid[:, None], acc, 0.0), axis=0)[None, :]
        pair = SUM_TO
        valid = SUM_TO >= 0
    c_ptrs = c_ptr + pair[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (offs_n < N)[None, :])
