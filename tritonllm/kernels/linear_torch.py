"""The cuBLAS (hipBLASLt) baseline of the linear op, as `kernels.linear=torch`: F.linear for
unquantized layers, torch._scaled_mm for FP8 and torch._int_mm for INT8 with row/column scales.
Activations are quantized with torch ops (kernels/reference.py's, the same values as the Triton
kernels'). Block-FP8, MXFP8 and weight-only formats have no cuBLAS path in torch: models with them
take the Triton implementation. `auto` takes this one for unquantized models only: on the H200 the
Triton W8A8 GEMMs are 1.6-2x faster than these layers (activation quantization by torch ops and
_scaled_mm / _int_mm; Llama-3-8B online FP8 batch-1 decode 291 vs 147 tok/s, experiments/gemm/);
`kernels.linear=torch` still runs them, as the cuBLAS baseline."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tritonllm.kernels.quant_formats import QuantizedActivation, QuantizedWeight
from tritonllm.kernels.reference import quantize_activation
from tritonllm.kernels.registry import FLOATS, Supports, register

TORCH_FORMATS = frozenset({"fp8:channel:token", "fp8:channel:tensor", "int8:channel:token", "int8:channel:tensor"})
INT_MM_MIN_ROWS = 17  # cuBLAS's int8 GEMM (torch._int_mm) needs more than 16 rows


@register(
    "linear", "torch",
    supports=Supports(dtypes=FLOATS, linear_formats=TORCH_FORMATS, auto_linear_formats=frozenset()), priority=20,
)  # fmt: skip
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def _pad(t: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    """t zero-padded along `dim` to a multiple (cuBLAS's FP8/INT8 GEMMs need N and K multiples of 16);
    model shapes already are, so this copies only for odd (test) shapes."""
    extra = -t.shape[dim] % multiple
    if not extra:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + [0, extra]
    return F.pad(t, pad)


@register("linear", "torch")
def quantized_linear(
    x: torch.Tensor | QuantizedActivation, weight: QuantizedWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    if isinstance(x, QuantizedActivation):  # quantized by the op before (fused into RMSNorm / SiLU-mul)
        q, scale = x.data, x.scale
    else:
        q, scale = quantize_activation(x.reshape(-1, x.shape[-1]), weight.scheme, weight.input_scale)
    m, n = q.shape[0], weight.shape[0]
    row_scale = scale.float().reshape(-1, 1).expand(m, 1).contiguous()
    col_scale = _pad(weight.scale.float(), 0, 16).reshape(1, -1)
    w = _pad(_pad(weight.data, 0, 16), 1, 16)
    q = _pad(q, 1, 16)
    if weight.scheme.is_fp8:
        y = torch._scaled_mm(q, w.t(), scale_a=row_scale, scale_b=col_scale, out_dtype=x.dtype)[:, :n]
        y = y + bias if bias is not None else y
    else:
        padded = F.pad(q, (0, 0, 0, max(0, INT_MM_MIN_ROWS - m)))
        y = (torch._int_mm(padded, w.t())[:m].float() * row_scale * col_scale)[:, :n]
        y = (y + bias.float() if bias is not None else y).to(x.dtype)
    return y.view(*x.shape[:-1], -1)
