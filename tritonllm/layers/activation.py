"""The gated activation of SwiGLU MLPs."""

from __future__ import annotations

import torch
from torch import nn

from tritonllm.kernels.registry import default_kernels


class SiluAndMul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernels = default_kernels()  # the engine binds its own (kernels/registry.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [num_tokens, 2 * d] = [gate | up] -> silu(gate) * up [num_tokens, d]."""
        return self.kernels.silu_and_mul(x)
