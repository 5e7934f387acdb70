"""Turn results JSONs ({"config": ..., "results": ...}, as `python -m tritonllm.run` writes them to
each run's folder and to output_json) into a study's figure.

    python scripts/plot.py multirun/2026-12-02/10-00-00 --x scheduler.max_num_batched_tokens \
        --y output_tok_per_s --hue kernels.attention --out experiments/STUDY/budget.png

Paths are JSON files or folders (searched for results.json and *.json). A key is dotted, looked up
in the results first, then the config (`results.` / `config.` prefixes force one). Numeric x values
give one line per hue value, others (or --bars) grouped bars.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(paths: list[str]) -> list[dict]:
    runs = []
    for path in map(Path, paths):
        files = [path] if path.is_file() else sorted(path.rglob("*.json"))
        for f in files:
            data = json.loads(f.read_text())
            if isinstance(data, dict) and "results" in data and "config" in data:
                runs.append(data)
    if not runs:
        raise SystemExit(f"no results JSON ({{'config', 'results'}}) under {paths}")
    return runs


def lookup(run: dict, key: str) -> Any:
    """The value of a dotted key in the run's results, else its config."""
    scopes = [key.split(".", 1)[0]] if key.split(".", 1)[0] in ("results", "config") else ["results", "config"]
    for scope in scopes:
        node: Any = run[scope]
        parts = key.split(".")[1:] if key.startswith(scope + ".") else key.split(".")
        for part in parts:
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            return node
    raise SystemExit(f"key {key!r} is in neither the results nor the config; results keys: {sorted(run['results'])}")


def plot(runs: list[dict], x: str, ys: list[str], hue: str | None, title: str, out: Path, bars: bool = False) -> None:
    """One panel per key of `ys`, side by side, sharing x and hue."""
    fig, axes = plt.subplots(1, len(ys), figsize=(6 * len(ys) + 2, 4.5), squeeze=False)
    for ax, y in zip(axes[0], ys):
        _panel(ax, runs, x, y, hue, bars)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


def _panel(ax, runs: list[dict], x: str, y: str, hue: str | None, bars: bool) -> None:
    series: dict[Any, list[tuple[Any, float]]] = defaultdict(list)
    for run in runs:
        series[lookup(run, hue) if hue else y].append((lookup(run, x), float(lookup(run, y))))
    xs = sorted({v for points in series.values() for v, _ in points}, key=str)
    numeric = not bars and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in xs)
    width = 0.8 / len(series)
    for i, (label, points) in enumerate(sorted(series.items(), key=lambda item: str(item[0]))):
        points.sort(key=lambda p: p[0] if numeric else str(p[0]))
        if numeric:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{hue}={label}" if hue else y)
        else:
            positions = [xs.index(p[0]) + (i - (len(series) - 1) / 2) * width for p in points]
            ax.bar(positions, [p[1] for p in points], width, label=f"{hue}={label}" if hue else y)
        for px, (_, vy) in zip([p[0] for p in points] if numeric else positions, points):
            ax.annotate(f"{vy:,.4g}", (px, vy), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=7)
    if not numeric:
        ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if hue:
        ax.legend(fontsize=8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="results JSON files or folders")
    parser.add_argument("--x", required=True)
    parser.add_argument("--y", required=True, nargs="+", help="one panel per key")
    parser.add_argument("--hue", default=None)
    parser.add_argument("--title", default="")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--bars", action="store_true", help="grouped bars even for numeric x")
    args = parser.parse_args(argv)
    plot(load(args.paths), args.x, args.y, args.hue, args.title, args.out, args.bars)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
