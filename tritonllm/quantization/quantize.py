"""Weight quantization at load time (online `quantization=` and the tests' published-layout
fixtures): a float weight [N, K] -> QuantizedWeight in a scheme's layout (kernels/quant_formats.py).

Runs once per layer at load, in torch: per-channel scales amax / qmax per row; 128 x 128 block
scales amax / qmax per block; MX: one e8m0 exponent per row and 32 columns, as for activations;
int4 / uint8: asymmetric per row and group of G columns, scale (max - min) / qmax (15 / 255) and
zero point round(-min / scale), values round(w / scale) + zero clamped to 0..qmax (as GPTQ / AWQ
store them); MXFP4: one e8m0 exponent per row and 32 columns, floor(log2(amax)) - 2 (e2m1's largest
exponent, as the OCP spec computes the shared scale), values rounded to the nearest e2m1 value.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tritonllm.kernels.quant import EPS
from tritonllm.kernels.quant_formats import BLOCK, E2M1_VALUES, MX_GROUP, QuantizedWeight, QuantScheme, pack_int4, qmax
from tritonllm.kernels.reference import quantize_activation, round_quantized


def quantize_weight(weight: torch.Tensor, scheme: QuantScheme) -> QuantizedWeight:
    """weight [N, K] (any float dtype) -> QuantizedWeight (data on weight's device)."""
    w = weight.float()
    dtype = scheme.weight_dtype
    if scheme.weight_scale == "channel":
        scale = w.abs().amax(-1).clamp(min=EPS) / qmax(dtype)
        return QuantizedWeight(scheme, round_quantized(w / scale[:, None], dtype), scale)
    if scheme.weight_scale == "group":
        return _quantize_grouped(w, scheme)
    if scheme.weight_scale == "mx" and scheme.packed:
        return _quantize_mxfp4(w, scheme)
    if scheme.weight_scale == "mx":  # the activation quantizer's MX rule, applied to the weight's rows
        data, scale = quantize_activation(w, scheme)
        return QuantizedWeight(scheme, data, scale)
    n, k = w.shape
    padded = F.pad(w, (0, -k % BLOCK, 0, -n % BLOCK))
    blocks = padded.view(padded.shape[0] // BLOCK, BLOCK, padded.shape[1] // BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=EPS) / qmax(dtype)
    data = round_quantized(blocks / scale[:, None, :, None], dtype).view(padded.shape)[:n, :k].contiguous()
    return QuantizedWeight(scheme, data, scale)


def _quantize_grouped(w: torch.Tensor, scheme: QuantScheme) -> QuantizedWeight:
    n, k = w.shape
    top = qmax(scheme.weight_dtype)
    if k % scheme.group_size:
        raise ValueError(f"{scheme.format_name}: K ({k}) must be a multiple of the group size ({scheme.group_size})")
    groups = w.view(n, k // scheme.group_size, scheme.group_size)
    low, high = groups.amin(-1).clamp(max=0.0), groups.amax(-1).clamp(min=0.0)  # 0 is exactly representable
    # float16 scales and zero points (as GPTQ / AWQ publish them: half the GEMV's scale bytes), the
    # values rounded with the float16 scale the kernels will read
    scale = ((high - low) / top).clamp(min=1e-7).to(torch.float16)
    zeros = torch.round(-low / scale.float()).clamp(0, top)
    q = torch.clamp(torch.round(groups / scale.float()[..., None]) + zeros[..., None], 0, top).view(n, k)
    data = pack_int4(q) if scheme.packed else q.to(torch.uint8)
    return QuantizedWeight(scheme, data, scale, zeros=zeros.to(torch.float16))


# midpoints between consecutive e2m1 magnitudes (codes 0..7): bucket i is magnitude code i
_E2M1_MIDPOINTS = torch.tensor([(a + b) / 2 for a, b in zip(E2M1_VALUES[:7], E2M1_VALUES[1:8])])


def _quantize_mxfp4(w: torch.Tensor, scheme: QuantScheme) -> QuantizedWeight:
    n, k = w.shape
    if k % MX_GROUP:
        raise ValueError(f"mxfp4: K ({k}) must be a multiple of {MX_GROUP}")
    groups = w.view(n, k // MX_GROUP, MX_GROUP)
    amax = groups.abs().amax(-1)
    exponent = (torch.floor(torch.log2(amax)).clamp(min=-127) - 2).clamp(-127, 127)  # e2m1's emax is 2
    v = groups / torch.exp2(exponent)[..., None]
    codes = torch.bucketize(v.abs(), _E2M1_MIDPOINTS.to(w.device)).to(torch.uint8) | ((v < 0).to(torch.uint8) << 3)
    return QuantizedWeight(scheme, pack_int4(codes.view(n, k)), (exponent + 127).to(torch.uint8))


def quantize_experts(weights: torch.Tensor, scheme: QuantScheme) -> QuantizedWeight:
    """Stacked expert weights [E, N, K] -> one QuantizedWeight whose data and scales are stacked per
    expert ([E, ...] of quantize_weight's layouts), as the fused MoE reads them."""
    per_expert = [quantize_weight(w, scheme) for w in weights]
    zeros = None if per_expert[0].zeros is None else torch.stack([q.zeros for q in per_expert])
    return QuantizedWeight(
        scheme, torch.stack([q.data for q in per_expert]), torch.stack([q.scale for q in per_expert]), zeros=zeros
    )
