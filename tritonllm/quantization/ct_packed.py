"""compressed-tensors `pack-quantized` checkpoints (W4A16, as llm-compressor writes them), read as
published and converted once at load into the kernels' int4 layout, as GPTQ's are
(quantization/gptq.py).

Published tensors of a linear layer with N outputs and K inputs, G columns a group (K for the
"channel" strategy): `weight_packed` int32 [N, K / 8] (eight 4-bit values of consecutive input
columns per int32, the first in the lowest bits, each stored as the signed value + 8),
`weight_scale` [N, K / G], `weight_shape` [N, K], and with `actorder: "group"` `weight_g_idx` [K].
Symmetric: w = (stored - 8) * scale, so the zero point is 8 everywhere.
"""

from __future__ import annotations

import torch
from torch import nn

from tritonllm.distributed.shard import RankSlice, TensorDims
from tritonllm.loader.safetensors_loader import materialize
from tritonllm.quantization.gptq import (
    PER_INT32,
    SCALE_DTYPE,
    GPTQMethod,
    int32_param,
    load_act_order,
    pack_int32,
    unpack_int32,
)
from tritonllm.quantization.methods import copy_weight

OFFSET = 8  # signed int4 values are stored + 8


class PackQuantizedMethod(GPTQMethod):
    """A layer stored as compressed-tensors pack-quantized tensors (symmetric, optional act order)."""

    TENSORS = ("weight_packed", "weight_scale", "weight_shape", "weight_g_idx")
    ACT_ORDER = "weight_g_idx"

    def shard_dims(self, name: str, shape: torch.Size) -> TensorDims:
        group = self.scheme.group_size
        dims = {
            "weight_packed": TensorDims(0, 1, 1, PER_INT32),
            "weight_scale": TensorDims(0, 1 if group > 0 else None, 1, group),
        }
        return dims.get(name) or super().shard_dims(name, shape)

    def rank_part(
        self, layer: nn.Module, name: str, loaded: torch.Tensor, rows: RankSlice | None, cols: RankSlice | None
    ) -> torch.Tensor:
        if name != "weight_shape":
            return super().rank_part(layer, name, loaded, rows, cols)
        # the checkpoint's [N, K] of the whole shard; the rank checks its own part's against its layer
        shape = [int(v) for v in materialize(loaded).reshape(-1)]
        whole = [part.total if part is not None else size for part, size in zip((rows, cols), shape)]
        if shape != whole:
            raise ValueError(f"{name}: {shape} is not the checkpoint layer's {whole}")
        return torch.tensor([part.count if part is not None else size for part, size in zip((rows, cols), shape)])

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        group = self.group_of(layer, in_features, out_features, packed_k=True, packed_n=False)
        layer.weight_packed = int32_param(out_features, in_features // PER_INT32)
        layer.weight_scale = nn.Parameter(torch.empty(out_features, in_features // group, dtype=SCALE_DTYPE), False)
        layer.weight_shape = nn.Parameter(torch.zeros(2, dtype=torch.int64), False)  # checked per shard at load
        if self.layer_quant.packing == "ct-g_idx":
            layer.weight_g_idx = int32_param(in_features, fill=-1)

    def load(self, layer: nn.Module, name: str, loaded: torch.Tensor, shard: tuple[int, int, int]) -> None:
        first, rows, _ = shard
        if name in ("weight_packed", "weight_scale"):
            copy_weight(getattr(layer, name).data.narrow(0, first, rows), loaded, name)
        elif name == "weight_shape":
            if [int(v) for v in loaded.reshape(-1)] != [rows, layer.in_features]:
                raise ValueError(f"{name}: {loaded.tolist()} is not this layer's [{rows}, {layer.in_features}]")
        elif name == "weight_g_idx":
            load_act_order(layer.weight_g_idx.data, loaded, name)
        else:
            super().load(layer, name, loaded, shard)

    def unpacked(self, layer: nn.Module) -> tuple[torch.Tensor, ...]:
        g_idx = getattr(layer, "weight_g_idx", None)
        g_idx = None if g_idx is None or (g_idx.data < 0).any() else g_idx.data
        q = unpack_int32(layer.weight_packed.data, 1)  # [N, K]
        return q, torch.full_like(layer.weight_scale.data, OFFSET), layer.weight_scale.data, g_idx


def pack_quantized_tensors(weight: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """A float weight [N, K] as compressed-tensors' pack-quantized tensors (symmetric int4, scale
    amax / 7.5 per group as its min-max observer computes it, values clamped to -8..7): fixtures."""
    n, k = weight.shape
    group = group_size if group_size > 0 else k
    w = weight.float().view(n, k // group, group)
    scale = (w.abs().amax(-1) / 7.5).clamp(min=1e-12)
    q = torch.clamp(torch.round(w / scale[..., None]), -8, 7).view(n, k).to(torch.int16)
    return {
        "weight_packed": pack_int32(q + OFFSET, 1),
        "weight_scale": scale.to(torch.bfloat16),
        "weight_shape": torch.tensor([n, k], dtype=torch.int64),
    }
