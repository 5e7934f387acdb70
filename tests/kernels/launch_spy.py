"""A Triton kernel stand-in for tests that must know a kernel ran: counts its launches."""

from __future__ import annotations


class LaunchSpy:
    """Wraps a Triton kernel: counts its launches."""

    def __init__(self, kernel) -> None:
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]
