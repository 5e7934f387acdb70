"""MXFP4 checkpoints (`quant_method: "mxfp4"`, as gpt-oss ships them), read as published.

A quantized tensor `<name>` of shape [N, K] is stored as two tensors:
- `<name>_blocks` uint8 [N, K / 32, 16]: 32 OCP e2m1 values per block of K, two a byte, the earlier
  column in the low nibble;
- `<name>_scales` uint8 [N, K / 32]: each block's e8m0 exponent, scale = 2 ** (e - 127).
For a linear layer `<name>` is its `weight`: `weight_blocks` / `weight_scales`.

The block bytes of a row are K-contiguous, which is the kernels' FP4 layout (kernels/quant_formats.py)
viewed as [N, K / 2]: no shuffle is needed, and the GEMM reads each row's bytes with wide
vector loads along K, decoding e2m1 in registers (no FP4 tensor cores on Hopper: the values are
widened to the activations' dtype before the dot).
"""

from __future__ import annotations

import torch
from torch import nn

from tritonllm.distributed.shard import TensorDims
from tritonllm.kernels.quant_formats import MX_GROUP, QuantizedWeight
from tritonllm.quantization.config import LayerQuant
from tritonllm.quantization.methods import LinearMethod, copy_weight

BYTES_PER_BLOCK = MX_GROUP // 2


class Mxfp4Method(LinearMethod):
    """A linear layer stored as `weight_blocks` / `weight_scales` (fused shards stacked along N)."""

    input_quant_fusable = False
    TENSORS = ("weight_blocks", "weight_scales")

    def __init__(self, layer_quant: LayerQuant) -> None:
        self.layer_quant = layer_quant
        self.scheme = layer_quant.scheme
        self.format_name = layer_quant.scheme.format_name

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        if in_features % MX_GROUP:
            raise ValueError(f"{self.format_name} layer [{out_features}, {in_features}]: K must be a multiple of 32")
        blocks = in_features // MX_GROUP
        layer.weight_blocks = nn.Parameter(torch.empty(out_features, blocks, BYTES_PER_BLOCK, dtype=torch.uint8), False)
        layer.weight_scales = nn.Parameter(torch.empty(out_features, blocks, dtype=torch.uint8), False)

    def shard_dims(self, name: str, shape: torch.Size) -> TensorDims:
        # weight_blocks [N, K / 32, 16], weight_scales [N, K / 32], bias [N]
        return TensorDims(0, None) if name == "bias" else TensorDims(0, 1, 1, MX_GROUP)

    def load(self, layer: nn.Module, name: str, loaded: torch.Tensor, shard: tuple[int, int, int]) -> None:
        first, rows, _ = shard
        if name in self.TENSORS:
            if loaded.dtype != torch.uint8:
                raise ValueError(f"{name}: the checkpoint stores {loaded.dtype}, MXFP4 {name} are uint8")
            copy_weight(getattr(layer, name).data.narrow(0, first, rows), loaded, name)
        elif name == "bias":
            copy_weight(layer.bias.data.narrow(0, first, rows), loaded, name)
        else:
            raise ValueError(f"{name}: no such tensor in an MXFP4 layer (weight_blocks, weight_scales, bias)")

    def finish_loading(self, layer: nn.Module) -> None:
        blocks = layer.weight_blocks.data
        data = blocks.reshape(blocks.shape[0], -1)  # [N, K / 2]: the rows' bytes, K-contiguous
        layer.mxfp4 = QuantizedWeight(self.scheme, data, layer.weight_scales.data.contiguous())
        for name in self.TENSORS:
            delattr(layer, name)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return layer.kernels.quantized_linear(x, layer.mxfp4, layer.bias)


def mxfp4_tensors(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """A float weight [N, K] as gpt-oss's published tensors (quantization/quantize.py's MXFP4 rule):
    the tests' fixtures."""
    from tritonllm.kernels.quant_formats import FP4, QuantScheme
    from tritonllm.quantization.quantize import quantize_weight

    qw = quantize_weight(weight, QuantScheme(FP4, "mx", "none"))
    n = qw.data.shape[0]
    return {"weight_blocks": qw.data.view(n, -1, BYTES_PER_BLOCK).contiguous(), "weight_scales": qw.scale}
