"""Iterate the tensors of a local safetensors checkpoint, single-file or sharded, memory-mapped.

safe_open maps each file, so a tensor is read from disk only when the model copies it into its
own (preallocated, possibly device) parameter: peak host memory stays about one tensor.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from tritonllm.loader.hf_config import SHARDED_WEIGHTS_INDEX, SINGLE_WEIGHTS_FILE


def weight_files(path: str | Path) -> list[Path]:
    """model.safetensors, or the shards that model.safetensors.index.json names (each once, sorted)."""
    folder = Path(path)
    if (folder / SINGLE_WEIGHTS_FILE).is_file():
        return [folder / SINGLE_WEIGHTS_FILE]
    index_file = folder / SHARDED_WEIGHTS_INDEX
    if not index_file.is_file():
        raise FileNotFoundError(
            f"model folder {str(folder)!r} has no weights: expected {SINGLE_WEIGHTS_FILE} or {SHARDED_WEIGHTS_INDEX}"
        )
    shards = sorted(set(json.loads(index_file.read_text())["weight_map"].values()))
    missing = [shard for shard in shards if not (folder / shard).is_file()]
    if missing:
        raise FileNotFoundError(f"{index_file} names shards that are not in the folder: {missing}")
    return [folder / shard for shard in shards]


def iterate_safetensors(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (tensor name, CPU tensor) for every tensor of the checkpoint in a model folder."""
    for file in weight_files(path):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
