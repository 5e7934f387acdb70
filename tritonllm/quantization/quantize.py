"""Weight quantization at load time (online `quantization=` and the tests' published-layout
fixtures): a float weight [N, K] -> QuantizedWeight in a scheme's layout (kernels/quant_formats.py).

Runs once per layer at load, in torch: per-channel scales amax / qmax per row; 128 x 128 block
scales amax / qmax per block; MX: one e8m0 exponent per row and 32 columns, as for activations;
int4: asymmetric per row and group of G columns, scale (max - min) / 15 and zero point
round(-min / scale), values round(w / scale) + zero clamped to 0..15 (as GPTQ / AWQ store them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tritonllm.kernels.quant import EPS
from tritonllm.kernels.quant_formats import BLOCK, QuantizedWeight, QuantScheme, pack_int4, qmax
from tritonllm.kernels.reference import quantize_activation, round_quantized


def quantize_weight(weight: torch.Tensor, scheme: QuantScheme) -> QuantizedWeight:
    """weight [N, K] (any float dtype) -> QuantizedWeight (data on weight's device)."""
    w = weight.float()
    dtype = scheme.weight_dtype
    if scheme.weight_scale == "channel":
        scale = w.abs().amax(-1).clamp(min=EPS) / qmax(dtype)
        return QuantizedWeight(scheme, round_quantized(w / scale[:, None], dtype), scale)
    if scheme.weight_scale == "group":
        return _quantize_int4(w, scheme)
    if scheme.weight_scale == "mx":  # the activation quantizer's MX rule, applied to the weight's rows
        data, scale = quantize_activation(w, scheme)
        return QuantizedWeight(scheme, data, scale)
    n, k = w.shape
    padded = F.pad(w, (0, -k % BLOCK, 0, -n % BLOCK))
    blocks = padded.view(padded.shape[0] // BLOCK, BLOCK, padded.shape[1] // BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=EPS) / qmax(dtype)
    data = round_quantized(blocks / scale[:, None, :, None], dtype).view(padded.shape)[:n, :k].contiguous()
    return QuantizedWeight(scheme, data, scale)


def _quantize_int4(w: torch.Tensor, scheme: QuantScheme) -> QuantizedWeight:
    n, k = w.shape
    if k % scheme.group_size:
        raise ValueError(f"int4: K ({k}) must be a multiple of the group size ({scheme.group_size})")
    groups = w.view(n, k // scheme.group_size, scheme.group_size)
    low, high = groups.amin(-1).clamp(max=0.0), groups.amax(-1).clamp(min=0.0)  # 0 is exactly representable
    scale = ((high - low) / 15.0).clamp(min=EPS)
    zeros = torch.round(-low / scale).clamp(0, 15)
    q = torch.clamp(torch.round(groups / scale[..., None]) + zeros[..., None], 0, 15).view(n, k)
    return QuantizedWeight(scheme, pack_int4(q), scale, zeros=zeros)
