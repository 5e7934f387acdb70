"""A Triton kernel stand-in for tests that must know a kernel ran: counts its launches and keeps their grids."""

from __future__ import annotations


class LaunchSpy:
    """Wraps a Triton kernel: counts its launches (`launches`) and records their grids (`grids`)."""

    def __init__(self, kernel) -> None:
        self.kernel, self.launches, self.grids = kernel, 0, []

    def __getitem__(self, grid):
        self.launches += 1
        self.grids.append(grid)
        return self.kernel[grid]
