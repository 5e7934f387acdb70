"""scripts/step_timeline.py: exposed time under overlapping launches, with a side stream."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from step_timeline import exposed_times, idle_gaps  # noqa: E402


def _k(name: str, ts: float, dur: float, stream: int = 7) -> dict:
    return {"name": name, "ts": ts, "dur": dur, "ph": "X", "cat": "kernel", "args": {"stream": stream}}


def test_overlapping_kernels_are_charged_only_past_the_frontier() -> None:
    table, idle, window = exposed_times([_k("a", 0, 10), _k("b", 8, 7), _k("c", 20, 5)])
    assert table["a"][0] == 10 and table["b"][0] == 5 and table["c"][0] == 5
    assert idle == 5 and window == 25


def test_a_side_stream_is_charged_only_for_the_main_streams_gaps_it_covers() -> None:
    events = [_k("a", 0, 10), _k("b", 12, 8), _k("c", 30, 4), _k("p", 5, 10, stream=9), _k("q", 24, 14, stream=9)]
    table, idle, window = exposed_times(events)
    assert table["a"][0] == 10 and table["b"][0] == 8 and table["c"][0] == 4
    # p covers the gap 10..12 (and runs under a and b); q covers 24..30 and 34..38 (the join at the end)
    assert table["[side] p"] == [2, 10, 1] and table["[side] q"] == [10, 14, 1]
    assert idle == 4  # 20..24
    assert window == 38


def test_idle_gaps_are_summed_by_the_kernels_around_them() -> None:
    events = [_k("a", 0, 10), _k("b", 8, 7), _k("g", 20, 5), _k("a", 30, 10), _k("g", 42, 1), _k("p", 0, 50, stream=9)]
    events += [_k("x", 50, 1), _k("y", 51, 1), _k("z", 52, 1)]  # the main stream has the most launches
    gaps = idle_gaps(events)
    # b ended the frontier (15) before g at 20; g (25) before a at 30; a (40) before g at 42; g (43) before x at 50
    assert gaps[("b", "g")] == [5, 1] and gaps[("g", "a")] == [5, 1]
    assert gaps[("a", "g")] == [2, 1] and gaps[("g", "x")] == [7, 1]
    assert sum(v[0] for v in gaps.values()) == 19
