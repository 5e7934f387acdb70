"""The kernel tests' comparison: the largest error relative to the reference's largest magnitude."""

from __future__ import annotations

import torch


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, rel: float) -> None:
    """Max |actual - expected| within rel x max |expected| (compared in float32; shapes must match)."""
    actual, expected = actual.float(), expected.float()
    assert actual.shape == expected.shape
    scale = expected.abs().max().clamp(min=1e-6)
    error = (actual - expected).abs().max()
    assert error <= rel * scale, f"max error {error:.3g} > {rel} x {scale:.3g}"
