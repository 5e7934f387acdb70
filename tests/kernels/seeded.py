"""Seeded random operands for the kernel tests: the same values on every machine and device."""

from __future__ import annotations

import torch

from tritonllm import platform


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """N(0, 1) values drawn on the CPU from `seed`, moved to the kernels' device as `dtype`."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(platform.DEVICE, dtype)
