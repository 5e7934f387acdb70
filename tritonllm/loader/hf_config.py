"""A local HuggingFace model folder: its config, its EOS token ids, and a check that it is complete.

Models are local folders only (no hub at run time): every transformers call passes
`local_files_only=True`, so a path that is not a folder fails here instead of reaching the network.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig

SINGLE_WEIGHTS_FILE = "model.safetensors"
SHARDED_WEIGHTS_INDEX = "model.safetensors.index.json"


def check_model_folder(path: str | Path, weights: bool = True) -> Path:
    """Fail with a message naming the missing file unless `path` holds config.json and (with `weights`)
    safetensors weights."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"model path {str(folder)!r} is not a folder: models are local HuggingFace folders")
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"model folder {str(folder)!r} has no config.json")
    if weights and not (folder / SINGLE_WEIGHTS_FILE).is_file() and not (folder / SHARDED_WEIGHTS_INDEX).is_file():
        raise FileNotFoundError(
            f"model folder {str(folder)!r} has no weights: expected {SINGLE_WEIGHTS_FILE} or {SHARDED_WEIGHTS_INDEX}"
            " (or run it with load_format=dummy: random weights)"
        )
    return folder


def load_hf_config(path: str | Path, weights: bool = True) -> PretrainedConfig:
    """The transformers config of a local model folder (never touches the network); `weights`: the
    folder must hold them too."""
    folder = check_model_folder(path, weights)
    return AutoConfig.from_pretrained(folder, local_files_only=True)


def load_eos_token_ids(path: str | Path, config: PretrainedConfig) -> list[int]:
    """EOS ids from generation_config.json (an int or a list there), else from config.eos_token_id.

    Chat models often list several (e.g. Llama 3's <|end_of_text|> and <|eot_id|>) only in
    generation_config.json, so it takes precedence.
    """
    eos = None
    generation_config = Path(path) / "generation_config.json"
    if generation_config.is_file():
        eos = json.loads(generation_config.read_text()).get("eos_token_id")
    if eos is None:
        eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(token_id) for token_id in eos]
