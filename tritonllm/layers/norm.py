"""RMSNorm, optionally fused with the residual add that precedes it in a pre-norm block, and with
the quantization of the next linear layer's input when that layer quantizes it per token (or per
1 x 128 group)."""

from __future__ import annotations

import torch
from torch import nn

from tritonllm.kernels.quant_formats import activation_group
from tritonllm.kernels.registry import default_kernels
from tritonllm.layers.linear import Linear, NormedInput


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.kernels = default_kernels()  # the engine binds its own (kernels/registry.py)
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self._quant_for: tuple = ()  # (the linear layer whose input this norm quantizes,), in a tuple: no submodule

    def quantize_for(self, linear: Linear) -> None:
        """Quantize the output for `linear` in the norm's kernel, where its method allows it (W8A8 per
        token, with a static input scale, or per 1 x 128 group for block-FP8); otherwise a no-op."""
        self._quant_for = (linear,) if linear.method.input_quant_fusable else ()

    def deferred(
        self, x: torch.Tensor | None, residual: torch.Tensor, defer: bool
    ) -> tuple[torch.Tensor | NormedInput, torch.Tensor]:
        """(the norm's output, the residual stream) where x is the last layer's output, or None where that
        layer added it into the stream already (Linear.forward_residual). With defer and x None, the output is
        a NormedInput that the next linear layer may normalize in its own GEMM."""
        if x is not None:
            return self(x, residual)
        if defer:
            return NormedInput(residual, self), residual
        return self(residual), residual

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x [num_rows, hidden]. Without residual: rms_norm(x). With residual: (rms_norm(x + residual),
        x + residual), the sum being the next residual."""
        if self._quant_for:  # the output as the next layer's GEMM reads it: a QuantizedActivation
            qweight = self._quant_for[0].qweight
            out, residual_out = self.kernels.rms_norm_quant(
                x, residual, self.weight, self.eps, qweight.scheme.weight_dtype, qweight.input_scale,
                group=activation_group(qweight.scheme),
            )  # fmt: skip
            return out if residual is None else (out, residual_out)
        if residual is None:
            return self.kernels.rms_norm(x, self.weight, self.eps)
        return self.kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)
