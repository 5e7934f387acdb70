"""RMSNorm, optionally fused with the residual add that precedes it in a pre-norm block."""

from __future__ import annotations

import torch
from torch import nn

from tritonllm.kernels import ops


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x [num_rows, hidden]. Without residual: rms_norm(x). With residual: (rms_norm(x + residual),
        x + residual), the sum being the next residual."""
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps)
        return ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
