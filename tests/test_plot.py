"""scripts/plot.py: a sweep's results JSONs become a figure; a key that is nowhere is refused by name."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("plot", Path(__file__).resolve().parents[1] / "scripts" / "plot.py")
plot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plot)


def _sweep(folder: Path) -> None:
    for i, (budget, attention) in enumerate([(512, "auto"), (2048, "auto"), (512, "torch_ref"), (2048, "torch_ref")]):
        run = folder / str(i)
        run.mkdir(parents=True)
        config = {"scheduler": {"max_num_batched_tokens": budget}, "kernels": {"attention": attention}}
        results = {"output_tok_per_s": budget / (1 if attention == "auto" else 4)}
        (run / "results.json").write_text(json.dumps({"config": config, "results": results}))


@pytest.mark.parametrize("x", ["scheduler.max_num_batched_tokens", "kernels.attention"])
def test_a_sweep_becomes_a_figure(tmp_path, x) -> None:
    _sweep(tmp_path / "sweep")
    out = tmp_path / "fig.png"
    hue = "kernels.attention" if x.startswith("scheduler") else "scheduler.max_num_batched_tokens"
    assert (
        plot.main([str(tmp_path / "sweep"), "--x", x, "--y", "output_tok_per_s", "--hue", hue, "--out", str(out)]) == 0
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.lookup(plot.load([str(tmp_path / "sweep")])[0], "results.output_tok_per_s") == 512


def test_a_missing_key_is_refused_by_name(tmp_path) -> None:
    _sweep(tmp_path / "sweep")
    with pytest.raises(SystemExit, match="'tok_per_s' is in neither"):
        plot.main(
            [str(tmp_path / "sweep"), "--x", "kernels.attention", "--y", "tok_per_s", "--out", str(tmp_path / "f.png")]
        )


def test_several_keys_become_panels_of_one_figure(tmp_path) -> None:
    _sweep(tmp_path / "sweep")
    out = tmp_path / "panels.png"
    args = [
        str(tmp_path / "sweep"),
        "--x",
        "kernels.attention",
        "--y",
        "output_tok_per_s",
        "config.scheduler.max_num_batched_tokens",
    ]
    assert plot.main([*args, "--out", str(out)]) == 0
    assert out.stat().st_size > 0
