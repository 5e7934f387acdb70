"""Linear layers with HF's weight layout [out_features, in_features], and fused variants.

HF checkpoints store q/k/v (and gate/up) as separate matrices; we keep each group in one fused
weight so a layer runs one GEMM instead of three (or two). `weight_loader` copies each HF shard
into its rows of the fused weight. Parameters are allocated uninitialised with torch.empty on the
current default device: models build their layers under `with torch.device(device)`.
"""

from __future__ import annotations

import torch
from torch import nn

from tritonllm.kernels.registry import default_kernels


def copy_weight(param: nn.Parameter, loaded_weight: torch.Tensor, name: str) -> None:
    """Copy a checkpoint tensor into a preallocated parameter (casting dtype, moving device)."""
    if param.shape != loaded_weight.shape:
        raise ValueError(
            f"{name}: the checkpoint's shape {tuple(loaded_weight.shape)} is not the model's {tuple(param.shape)}"
        )
    param.data.copy_(loaded_weight)


class Linear(nn.Module):
    """y = x @ weight.T (+ bias); weight [out_features, in_features]."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.kernels = default_kernels()  # the engine binds its own (kernels/registry.py)
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Several linear maps of the same input in one weight: rows are the shards, in order.

    shard_sizes maps each shard id (e.g. "gate", "up") to its number of output rows.
    """

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool, dtype: torch.dtype) -> None:
        super().__init__(in_features, sum(shard_sizes.values()), bias, dtype)
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        offset = 0
        for shard_id, size in shard_sizes.items():
            self.shard_offsets[shard_id] = (offset, size)
            offset += size

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str) -> None:
        """Copy one shard (a weight [size, in] or a bias [size]) into its rows of the fused param."""
        offset, size = self.shard_offsets[shard_id]
        copy_weight(param.narrow(0, offset, size), loaded_weight, f"shard {shard_id!r} of a fused weight")

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The output columns of each shard, in order (views of y)."""
        return y.split([size for _, size in self.shard_offsets.values()], dim=-1)


class QKVLinear(MergedLinear):
    """q, k and v projections fused: rows [q (num_heads * head_dim) | k | v (num_kv_heads * head_dim each)]."""

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool, dtype: torch.dtype
    ) -> None:
        shard_sizes = {"q": num_heads * head_dim, "k": num_kv_heads * head_dim, "v": num_kv_heads * head_dim}
        super().__init__(hidden_size, shard_sizes, bias, dtype)
