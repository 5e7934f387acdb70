"""Linear layers with HF's weight layout [out_features, in_features], and fused variants.

HF checkpoints store q/k/v (and gate/up) as separate matrices; we keep each group in one fused
weight so a layer runs one GEMM instead of three (or two). `load_param` puts each HF tensor (a
weight, bias or scale shard) into its rows of the fused layer. What a layer stores and which kernel
it calls is its linear method's (quantization/methods.py): unquantized, quantized in the
checkpoint, or quantized online. Parameters are allocated uninitialised with torch.empty on the
current default device: models build their layers under `with torch.device(device)`.
"""

from __future__ import annotations

import torch
from torch import nn

from tritonllm.kernels.registry import default_kernels
from tritonllm.quantization.config import LayerQuant
from tritonllm.quantization.methods import Shard, make_method


class Linear(nn.Module):
    """y = x @ weight.T (+ bias); weight [out_features, in_features], stored per `quant` (None:
    in `dtype`)."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype, quant: LayerQuant | None = None
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.kernels = default_kernels()  # the engine binds its own (kernels/registry.py)
        self.method = make_method(quant)
        self.method.create_weights(self, in_features, out_features, dtype)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False) if bias else None

    @property
    def format_name(self) -> str:
        """ "float", or the quantized format (kernels/quant_formats.py) the kernels must serve."""
        return self.method.format_name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)

    def shard(self, shard_id: str | None) -> Shard:
        """(first output row, rows, shard index) of a checkpoint shard; the whole layer for None."""
        if shard_id is not None:
            raise ValueError(f"shard {shard_id!r} of an unfused layer")
        return 0, self.out_features, 0

    def load_param(self, name: str, loaded: torch.Tensor, shard_id: str | None = None) -> None:
        """Copy the checkpoint tensor `name` (weight, bias, weight_scale, ...) of shard `shard_id`."""
        self.method.load(self, name, loaded, self.shard(shard_id))

    def finish_loading(self) -> None:
        """After every tensor is in: an online method quantizes, a checkpoint one assembles its weight."""
        self.method.finish_loading(self)


class MergedLinear(Linear):
    """Several linear maps of the same input in one weight: rows are the shards, in order.

    shard_sizes maps each shard id (e.g. "gate", "up") to its number of output rows.
    """

    def __init__(
        self,
        in_features: int,
        shard_sizes: dict[str, int],
        bias: bool,
        dtype: torch.dtype,
        quant: LayerQuant | None = None,
    ) -> None:
        # set before Linear.__init__: the linear method's create_weights reads it (a plain dict
        # attribute needs no nn.Module state)
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        offset = 0
        for shard_id, size in shard_sizes.items():
            self.shard_offsets[shard_id] = (offset, size)
            offset += size
        super().__init__(in_features, offset, bias, dtype, quant)

    def shard(self, shard_id: str | None) -> Shard:
        if shard_id is None:
            raise ValueError(f"a fused layer is loaded by shard ({list(self.shard_offsets)}), not whole")
        offset, size = self.shard_offsets[shard_id]
        return offset, size, list(self.shard_offsets).index(shard_id)

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The output columns of each shard, in order (views of y)."""
        return y.split([size for _, size in self.shard_offsets.values()], dim=-1)


class QKVLinear(MergedLinear):
    """q, k and v projections fused: rows [q (num_heads * head_dim) | k | v (num_kv_heads * head_dim each)]."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool,
        dtype: torch.dtype,
        quant: LayerQuant | None = None,
    ) -> None:
        shard_sizes = {"q": num_heads * head_dim, "k": num_kv_heads * head_dim, "v": num_kv_heads * head_dim}
        super().__init__(hidden_size, shard_sizes, bias, dtype, quant)
