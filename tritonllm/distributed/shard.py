"""What a tensor-parallel rank takes of a linear layer's checkpoint tensors.

A column-parallel layer holds some of the layer's output rows, a row-parallel one some of its
input columns (`RankSlice`). Each checkpoint tensor of a layer runs along those in its own way
(`TensorDims`, declared per tensor by the layer's linear method): a weight [N, K] along dims 0 and
1; a bias only along N; GPTQ's qweight [K / 8, N] along K packed 8 to an int32; a 128 x 128 block
scale grid along both, one element per 128. `narrow_to_rank` reads this rank's part (from the
safetensors file only that part, loader/safetensors_loader.py), refusing a split that would cut a
packed element, a scale block or a group.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from tritonllm.loader.safetensors_loader import CheckpointSlice, materialize


class RankSlice(NamedTuple):
    """Rows (or columns) first..first + count of a checkpoint tensor's `total`: this rank's."""

    first: int
    count: int
    total: int

    @property
    def is_split(self) -> bool:
        return self.count != self.total


class TensorDims(NamedTuple):
    """Where a checkpoint tensor keeps a linear layer's output rows and input columns: the dim of
    each (None: it does not run along it) and how many rows or columns one element stands for."""

    out_dim: int | None
    in_dim: int | None
    out_unit: int = 1
    in_unit: int = 1


WHOLE = TensorDims(None, None)  # per-tensor scales, static input scales: every rank takes all of it


def narrow_to_rank(
    loaded: torch.Tensor | CheckpointSlice, name: str, dims: TensorDims, rows: RankSlice | None, cols: RankSlice | None
) -> torch.Tensor:
    """This rank's part of checkpoint tensor `name`: its `rows` along dims.out_dim and its `cols` along
    dims.in_dim (None, or a dim the tensor lacks: all of it)."""
    for dim, unit, part, what in ((dims.out_dim, dims.out_unit, rows, "output rows"),
                                  (dims.in_dim, dims.in_unit, cols, "input columns")):  # fmt: skip
        if dim is None or part is None or not part.is_split:
            continue
        if part.first % unit or part.count % unit:
            raise ValueError(
                f"{name}: a tensor-parallel rank's {what} {part.first}..{part.first + part.count} would split its "
                f"elements of {unit} (packed values, scale blocks or groups): choose a tensor_parallel_size that "
                "gives every rank whole ones"
            )
        loaded = loaded.narrow(dim, part.first // unit, part.count // unit)
    return materialize(loaded)
