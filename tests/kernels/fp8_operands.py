"""FP8 W8A8 operands of the skinny GEMM tests (per-channel weight scales, per-token activation scales) and the
float32 product of their dequantized values."""

from __future__ import annotations

import torch
from seeded import randn  # this folder

from tritonllm.kernels.quant import quantize_per_token
from tritonllm.kernels.quant_formats import QuantScheme
from tritonllm.quantization.quantize import quantize_weight

FP8 = QuantScheme(torch.float8_e4m3fn, "channel", "token")


def fp8_operands(m: int, n: int, k: int, seed: int):
    """(x's FP8 values, their per-token scales, the FP8 weight, the float32 product of the dequantized
    operands) for seeded x [M, K] and weight [N, K]."""
    x = randn(m, k, seed=seed, dtype=torch.bfloat16)
    weight = quantize_weight(randn(n, k, seed=seed + 1), FP8)
    q, scale = quantize_per_token(x, torch.float8_e4m3fn)
    expected = (q.float() * scale) @ (weight.data.float() * weight.scale[:, None]).T
    return q, scale, weight, expected
