"""Iterate the tensors of a local safetensors checkpoint, single-file or sharded, memory-mapped.

safe_open maps each file, so a tensor is read from disk only when the model copies it into its
own (preallocated, possibly device) parameter: peak host memory stays about one tensor. With
tensor parallelism (`lazy=True`) the tensors come as `CheckpointSlice`s, not read yet: a rank's
layer reads only its rows or columns of them (`narrow`), the other layers all of it (`materialize`).
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


class CheckpointSlice:
    """A checkpoint tensor not read yet (valid while its file is open: during its loop iteration)."""

    def __init__(self, file, name: str) -> None:  # noqa: ANN001 (safetensors' safe_open handle)
        self._file = file
        self._name = name
        self._slice = file.get_slice(name)
        self.shape = torch.Size(self._slice.get_shape())

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        """Read only elements start..start + length along `dim` (as torch.Tensor.narrow, but a copy)."""
        index = tuple(slice(start, start + length) if d == dim else slice(None) for d in range(len(self.shape)))
        return self._slice[index]

    def load(self) -> torch.Tensor:
        return self._file.get_tensor(self._name)


def materialize(tensor: torch.Tensor | CheckpointSlice) -> torch.Tensor:
    """The whole tensor (read now if it is a CheckpointSlice); anything else is returned as it is."""
    return tensor.load() if isinstance(tensor, CheckpointSlice) else tensor


def iterate_safetensors(path: str | Path, lazy: bool = False) -> Iterator[tuple[str, torch.Tensor | CheckpointSlice]]:
    """Yield (tensor name, CPU tensor) for every tensor of the checkpoint in a model folder; with
    `lazy`, (tensor name, CheckpointSlice) instead, to be read in part or whole by its consumer."""
    for file in weight_files(path):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                yield name, (CheckpointSlice(f, name) if lazy else f.get_tensor(name))
