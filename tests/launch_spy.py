"""A Triton kernel stand-in for tests that must know a kernel ran: counts its launches and keeps their grids."""

from __future__ import annotations


class LaunchSpy:
    """Wraps a Triton kernel: counts its launches (`launches`) and records their grids (`grids`) and keyword
    arguments (`calls`: the constexprs a launcher passes by name)."""

    def __init__(self, kernel) -> None:
        self.kernel, self.launches, self.grids, self.calls = kernel, 0, [], []

    def __getitem__(self, grid):
        self.launches += 1
        self.grids.append(grid)
        launch = self.kernel[grid]

        def call(*args, **kwargs):
            self.calls.append(kwargs)
            return launch(*args, **kwargs)

        return call

    @classmethod
    def install(cls, monkeypatch, owner, name: str) -> LaunchSpy:
        """Puts a spy in place of `owner.name` (a module's kernel, or a launcher's `fn`) for one test."""
        spy = cls(getattr(owner, name))
        monkeypatch.setattr(owner, name, spy)
        return spy
