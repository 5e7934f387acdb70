"""AWQ checkpoints (`quant_method: "awq"`, AutoAWQ's GEMM version), 4-bit, read as published and
converted once at load into the kernels' int4 layout, as GPTQ's are (quantization/gptq.py).

Published tensors of a linear layer with N outputs and K inputs, G columns a group:
- `qweight` int32 [K, N / 8]: eight 4-bit values of consecutive output columns per int32, in
  AutoAWQ's interleaved order: bits 4i..4i+3 hold column AWQ_ORDER[i] of the eight;
- `qzeros` int32 [K / G, N / 8]: the zero points, packed the same way (stored as they are);
- `scales` float16 [K / G, N].
w[n, k] = (q - zero) * scale of group k // G. Other AWQ versions (GEMV, Marlin, ExLlama) are refused.
"""

from __future__ import annotations

import torch
from torch import nn

from tritonllm.distributed.shard import TensorDims
from tritonllm.quantization.gptq import (
    PER_INT32,
    SCALE_DTYPE,
    GPTQMethod,
    int32_param,
    load_packed_columns,
    pack_int32,
    unpack_int32,
)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the column (of eight) that nibble i holds
_NIBBLE_OF_COLUMN = torch.tensor([AWQ_ORDER.index(c) for c in range(PER_INT32)])


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, N / 8] in AWQ's order -> int16 [R, N] values 0..15 in column order."""
    nibbles = unpack_int32(packed, 1).view(packed.shape[0], -1, PER_INT32)  # [R, N / 8, nibble]
    return nibbles[:, :, _NIBBLE_OF_COLUMN.to(packed.device)].reshape(packed.shape[0], -1)


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """unpack_awq's inverse: [R, N] values 0..15 -> int32 [R, N / 8] in AWQ's order."""
    grouped = values.view(values.shape[0], -1, PER_INT32)[:, :, list(AWQ_ORDER)]
    return pack_int32(grouped.reshape(values.shape[0], -1), 1)


class AWQMethod(GPTQMethod):
    """A layer stored as AWQ tensors (no act order, zero points as they are)."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        groups = in_features // self.group_of(layer, in_features, out_features, packed_k=False, packed_n=True)
        layer.qweight = int32_param(in_features, out_features // PER_INT32)
        layer.qzeros = int32_param(groups, out_features // PER_INT32)
        layer.scales = nn.Parameter(torch.empty(groups, out_features, dtype=SCALE_DTYPE), False)

    def shard_dims(self, name: str, shape: torch.Size) -> TensorDims:
        if name == "qweight":  # [K, N / 8]
            return TensorDims(1, 0, PER_INT32, 1)
        return super().shard_dims(name, shape)

    def load(self, layer: nn.Module, name: str, loaded: torch.Tensor, shard: tuple[int, int, int]) -> None:
        first, rows, _ = shard
        if name in ("qweight", "qzeros"):
            load_packed_columns(getattr(layer, name).data, loaded, first, rows, name)
        elif name == "g_idx":
            raise ValueError(f"{name}: AWQ checkpoints have no act order")
        else:
            super().load(layer, name, loaded, shard)

    def unpacked(self, layer: nn.Module) -> tuple[torch.Tensor, ...]:
        return unpack_awq(layer.qweight.data).T, unpack_awq(layer.qzeros.data).T, layer.scales.data.T, None


def awq_tensors(weight: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """A float weight [N, K] as AWQ's published tensors (round-to-nearest per group, asymmetric;
    without AWQ's activation-aware scaling search): the tests' fixtures."""
    from tritonllm.kernels.quant_formats import INT4, QuantScheme, unpack_int4
    from tritonllm.quantization.quantize import quantize_weight

    qw = quantize_weight(weight, QuantScheme(INT4, "group", "none", group_size=group_size))
    q = unpack_int4(qw.data).to(torch.int16)  # [N, K]
    return {
        "qweight": pack_awq(q.T.contiguous()),
        "qzeros": pack_awq(qw.zeros.T.to(torch.int16).contiguous()),
        "scales": qw.scale.T.to(torch.float16).contiguous(),
    }
