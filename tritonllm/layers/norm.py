"""RMSNorm, optionally fused with the residual add that precedes it in a pre-norm block."""

from __future__ import annotations

import torch
from torch import nn

from tritonllm.kernels.registry import default_kernels


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.kernels = default_kernels()  # the engine binds its own (kernels/registry.py)
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x [num_rows, hidden]. Without residual: rms_norm(x). With residual: (rms_norm(x + residual),
        x + residual), the sum being the next residual."""
        if residual is None:
            return self.kernels.rms_norm(x, self.weight, self.eps)
        return self.kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)
