"""Where results go: nowhere extra (stdout only) or Weights & Biases."""

from __future__ import annotations

from typing import Any


class NullLogger:
    def log(self, results: dict[str, Any]) -> None:
        pass


class WandbLogger:
    def __init__(self, settings: dict[str, Any], config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ValueError("logger=wandb needs the wandb package: pip install -e '.[wandb]'") from e
        self.run = wandb.init(project=settings["project"], name=settings.get("run_name"), config=config)

    def log(self, results: dict[str, Any]) -> None:
        self.run.log({k: v for k, v in results.items() if isinstance(v, (int, float))})
        self.run.summary.update(results)
        self.run.finish()


def make_logger(settings: dict[str, Any], config: dict[str, Any]) -> NullLogger | WandbLogger:
    kind = settings.get("kind", "none")
    if kind == "none":
        return NullLogger()
    if kind == "wandb":
        return WandbLogger(settings, config)
    raise ValueError(f"logger.kind={kind!r} is not one of ['none', 'wandb']")
