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


def assert_close_per_row(actual: torch.Tensor, expected: torch.Tensor, rel_rms: float) -> None:
    """Each row's (first dim: a token) RMS error within rel_rms x that row's reference RMS. Unlike an
    absolute tolerance, it tracks the output's size: attention over thousands of keys averages random
    values down to ~0.01, where an absolute 1.5e-2 passes anything."""
    actual, expected = actual.float().flatten(1), expected.float().flatten(1)
    assert actual.shape == expected.shape
    error = (actual - expected).pow(2).mean(1).sqrt()
    scale = expected.pow(2).mean(1).sqrt().clamp(min=1e-6)
    worst = int((error / scale).argmax())
    assert error[worst] <= rel_rms * scale[worst], (
        f"row {worst}: RMS error {error[worst]:.3g} > {rel_rms} x its reference RMS {scale[worst]:.3g}"
    )
