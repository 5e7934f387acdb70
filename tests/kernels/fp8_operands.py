"""FP8 W8A8 operands of the skinny GEMM tests (per-channel weight scales, per-token activation scales) and the
float32 product of their dequantized values."""

from __future__ import annotations

import torch
from seeded import randn  # this folder

from tritonllm.kernels.quant import quantize_per_group, quantize_per_token
from tritonllm.kernels.quant_formats import QuantScheme
from tritonllm.quantization.quantize import quantize_weight

FP8 = QuantScheme(torch.float8_e4m3fn, "channel", "token")


def fp8_operands(m: int, n: int, k: int, seed: int, groups: bool = False):
    """(x's FP8 values, their per-token scales, the FP8 weight, the float32 product of the dequantized
    operands) for seeded x [M, K] and weight [N, K]; groups: x's scales per 1 x 128 group instead ([M, K / 128],
    column-major, as the attention quantizes o_proj's input where its linear implementation asks for them), each
    group's values scaled apart (so a kernel reading one group's scale for another's is far off)."""
    x = randn(m, k, seed=seed, dtype=torch.bfloat16)
    weight = quantize_weight(randn(n, k, seed=seed + 1), FP8)
    if groups:
        x = x * (1 + torch.arange(k // 128, device=x.device) % 5).repeat_interleave(128).to(x.dtype) ** 2
        q, scale = quantize_per_group(x, torch.float8_e4m3fn, 128)
        a = q.float() * scale.repeat_interleave(128, 1)
    else:
        q, scale = quantize_per_token(x, torch.float8_e4m3fn)
        a = q.float() * scale
    expected = a @ (weight.data.float() * weight.scale[:, None]).T
    return q, scale, weight, expected
