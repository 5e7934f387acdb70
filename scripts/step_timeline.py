"""What each kernel adds to a decode step when kernels overlap (programmatic dependent launch), from a
Chrome trace that `scripts/profile_steps.py --trace` wrote.

With PDL a kernel starts before the previous one ends and waits inside, so its duration counts time
that another kernel already accounts for, and summing durations overstates it. Here the GPU's
completion frontier is walked in start order: a kernel is charged only for how far it moves the
latest end seen so far (its exposed time); a gap before a kernel that starts after the frontier is
idle. Exposed times and idle sum to the traced window. Kernels are told apart by name and grid (the
four linear layers of a Llama block run one GEMM kernel on four grids). Only the main stream's kernels move
the frontier; a side stream's (the L2 weight prefetches) are charged for the main stream's gaps they cover.

With --gaps N it also lists where the main stream sat idle: the idle time summed by the pair of kernels
around each gap (the one that ended the frontier, the one that started after it), the N largest pairs.
Gaps that sit at graph boundaries or before eager launches show host time the GPU waited for.

    python scripts/step_timeline.py TRACE.json[.gz] --steps 20 [--json OUT.json] [--gaps 10]
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def load_events(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]


def label(event: dict) -> str:
    name = event["name"]
    if len(name) > 60:
        name = name[:57] + "..."
    grid = event.get("args", {}).get("grid")
    return f"{name} {tuple(grid)}" if grid else name


def stream(event: dict) -> object:
    """The CUDA stream an event ran on (torch's traces: args.stream, else the tid)."""
    return event.get("args", {}).get("stream", event.get("tid"))


def main_stream(events: list[dict]) -> object:
    """The stream with the most launches: the step's own (the others are side streams, e.g. L2 prefetches)."""
    launches: dict[object, int] = defaultdict(int)
    for e in events:
        launches[stream(e)] += 1
    return max(launches, key=launches.get)


def exposed_times(events: list[dict]) -> tuple[dict[str, list[float]], float, float]:
    """({label: [exposed us, summed duration us, launches]}, idle us, window us).

    The frontier is walked over the main stream's events (the stream with the most launches). Kernels on
    other streams (the L2 weight prefetches' side stream) are labelled "[side] ..." and charged only for the
    gaps of the main stream that they cover (the main stream waiting at a join, say): the rest of a gap is
    idle. Their work under main-stream kernels costs the step nothing that this walk can see."""
    main = main_stream(events)
    events = sorted(events, key=lambda e: e["ts"])
    side = [e for e in events if stream(e) != main]
    table: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for e in side:
        row = table["[side] " + label(e)]
        row[1] += e["dur"]
        row[2] += 1
    start = frontier = events[0]["ts"]
    idle = 0.0

    def charge_gap(lo: float, hi: float) -> None:
        nonlocal idle
        covered_to = lo
        for e in side:  # in start order: each part of the gap goes to the first side kernel covering it
            a, b = max(e["ts"], covered_to), min(e["ts"] + e["dur"], hi)
            if b > a:
                idle += a - covered_to
                table["[side] " + label(e)][0] += b - a
                covered_to = b
        idle += hi - covered_to

    for e in events:
        if stream(e) != main:
            continue
        end = e["ts"] + e["dur"]
        if e["ts"] > frontier:
            charge_gap(frontier, e["ts"])
            frontier = e["ts"]
        row = table[label(e)]
        row[0] += max(0.0, end - frontier)
        row[1] += e["dur"]
        row[2] += 1
        frontier = max(frontier, end)
    last_side = max((e["ts"] + e["dur"] for e in side), default=frontier)
    if last_side > frontier:  # side work past the main stream's last kernel
        charge_gap(frontier, last_side)
        frontier = last_side
    return dict(table), idle, frontier - start


def idle_gaps(events: list[dict]) -> dict[tuple[str, str], list[float]]:
    """{(kernel before, kernel after): [idle us, gaps]} over the main stream's gaps (the frontier walk of
    exposed_times, side streams ignored): the kernel before is the one whose end set the frontier."""
    main = main_stream(events)
    gaps: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    frontier, last = None, None
    for e in sorted((e for e in events if stream(e) == main), key=lambda e: e["ts"]):
        if frontier is not None and e["ts"] > frontier:
            row = gaps[(label(last), label(e))]
            row[0] += e["ts"] - frontier
            row[1] += 1
        end = e["ts"] + e["dur"]
        if frontier is None or end >= frontier:
            frontier, last = end, e
    return dict(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--steps", type=int, required=True, help="engine steps the trace holds")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", default=None)
    parser.add_argument("--gaps", type=int, default=0, help="list the N kernel pairs around the most idle time")
    args = parser.parse_args()
    events = load_events(args.trace)
    if not events:
        raise SystemExit(f"{args.trace}: no GPU kernel, copy or memset events (a CPU-only profile?)")
    table, idle, window = exposed_times(events)
    per_step = {
        k: [round(v[0] / args.steps, 2), round(v[1] / args.steps, 2), v[2] / args.steps] for k, v in table.items()
    }
    rows = sorted(per_step.items(), key=lambda kv: -kv[1][0])
    print(f"window {window / args.steps:.1f} us a step, idle {idle / args.steps:.1f} us a step")
    print(f"{'exposed us':>10} {'duration us':>11} {'launches':>8}  kernel (grid)")
    for name, (exposed, duration, launches) in rows[: args.top]:
        print(f"{exposed:10.1f} {duration:11.1f} {launches:8.1f}  {name}")
    gaps = sorted(idle_gaps(events).items(), key=lambda kv: -kv[1][0])[: args.gaps]
    if gaps:
        print(f"{'idle us':>10} {'gaps':>8}  kernel before -> kernel after (a step)")
        for (before, after), (us, n) in gaps:
            print(f"{us / args.steps:10.1f} {n / args.steps:8.1f}  {before} -> {after}")
    if args.json:
        result = {"window_us_per_step": window / args.steps, "idle_us_per_step": idle / args.steps,
                  "per_step": {k: dict(exposed_us=v[0], duration_us=v[1], launches=v[2]) for k, v in rows}}  # fmt: skip
        if gaps:
            result["idle_gaps_per_step"] = [dict(before=b, after=a, idle_us=us / args.steps, gaps=n / args.steps)
                                            for (b, a), (us, n) in gaps]  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
