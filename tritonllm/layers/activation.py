"""The gated activation of SwiGLU MLPs."""

from __future__ import annotations

import torch
from torch import nn

from tritonllm.kernels import ops


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [num_tokens, 2 * d] = [gate | up] -> silu(gate) * up [num_tokens, d]."""
        return ops.silu_and_mul(x)
