"""Where a run's records go besides stdout and its results JSON: nowhere, a JSON-lines file, or
Weights & Biases.

A run logs its resolved config (`start`), a per-step time series (step time, batch size,
scheduled tokens, KV usage, running/waiting: `log_steps`), a per-request table (prompt and output
lengths, TTFT, TPOT: `log_requests`) and its final figures (`finish`). W&B runs offline by default
(`logger.mode=offline`: no network or account; `wandb sync` later) and a sweep's runs share a
`group` so W&B plots them side by side; `logger=jsonl` writes the same records to a file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

Record = dict[str, Any]


@dataclass
class NoLoggerConfig:
    kind: str = "none"


@dataclass
class JsonlLoggerConfig:
    kind: str = "jsonl"
    path: str | None = None  # None: records.jsonl in the run's output folder


@dataclass
class WandbLoggerConfig:
    kind: str = "wandb"
    project: str = "tritonllm"
    mode: str = "offline"  # or "online" (an account), "disabled"
    group: str | None = None  # None: a sweep's runs are grouped by the sweep folder's name
    run_name: str | None = None


LOGGER_TYPES: dict[str, type] = {"none": NoLoggerConfig, "jsonl": JsonlLoggerConfig, "wandb": WandbLoggerConfig}


class RunLogger(Protocol):
    def start(self, config: Record) -> None: ...
    def log_steps(self, steps: list[Record]) -> None: ...
    def log_requests(self, requests: list[Record]) -> None: ...
    def finish(self, results: Record) -> None: ...


class NullLogger:
    def start(self, config: Record) -> None:
        pass

    def log_steps(self, steps: list[Record]) -> None:
        pass

    def log_requests(self, requests: list[Record]) -> None:
        pass

    def finish(self, results: Record) -> None:
        pass


class JsonlLogger:
    """One JSON object per line: {"kind": "config" | "step" | "request" | "results", ...}."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("w")

    def _write(self, kind: str, record: Record) -> None:
        self.file.write(json.dumps({"kind": kind, **record}) + "\n")

    def start(self, config: Record) -> None:
        self._write("config", {"config": config})

    def log_steps(self, steps: list[Record]) -> None:
        for step in steps:
            self._write("step", step)

    def log_requests(self, requests: list[Record]) -> None:
        for request in requests:
            self._write("request", request)

    def finish(self, results: Record) -> None:
        self._write("results", {"results": results})
        self.file.close()


class WandbLogger:
    def __init__(self, settings: Record, run_dir: Path, group: str | None) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ValueError("logger=wandb needs the wandb package: pip install -e '.[wandb]'") from e
        self.wandb = wandb
        self.settings, self.run_dir, self.group = settings, run_dir, group
        self.run = None

    def start(self, config: Record) -> None:
        s = self.settings
        self.run = self.wandb.init(
            project=s.get("project", "tritonllm"), name=s.get("run_name"), group=s.get("group") or self.group,
            mode=s.get("mode", "offline"), dir=str(self.run_dir), config=config, reinit="finish_previous",
        )  # fmt: skip

    def log_steps(self, steps: list[Record]) -> None:
        for step in steps:
            self.run.log({f"step/{k}": v for k, v in step.items()}, step=step["step"])

    def log_requests(self, requests: list[Record]) -> None:
        if requests:
            columns = list(requests[0])
            table = self.wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in requests])
            self.run.log({"requests": table})

    def finish(self, results: Record) -> None:
        self.run.summary.update({k: v for k, v in results.items() if isinstance(v, (int, float, str, bool))})
        self.run.finish()


def make_logger(settings: Record, run_dir: Path, group: str | None = None) -> RunLogger:
    """settings: the `logger` config group; run_dir: the run's output folder (Hydra's); group: the
    sweep's name when the run belongs to one."""
    kind = settings.get("kind", "none")
    if kind == "none":
        return NullLogger()
    if kind == "jsonl":
        return JsonlLogger(Path(settings.get("path") or run_dir / "records.jsonl"))
    if kind == "wandb":
        return WandbLogger(settings, run_dir, group)
    raise ValueError(f"logger.kind={kind!r} is not one of ['none', 'jsonl', 'wandb']")
