"""GGUF linear layers: llama.cpp's quantized blocks decoded once at load, in Triton
(kernels/gguf_dequant.py), into the grouped-integer layouts the quantized GEMMs already serve
(kernels/quant_formats.py); no GGUF-specific GEMM.

A layer's layout follows its shards' GGUF types (llama.cpp mixes types in one file, Q4_K_M puts
Q6_K beside Q4_K, even within the fused q/k/v):
- every shard MXFP4: FP4 with e8m0 scales per 32 columns (the OCP MX layout);
- else every shard of at most 4 bits (Q4_0, Q4_1, Q2_K, Q3_K, Q4_K): INT4 packed two a byte;
- else (Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, MXFP4 among others): UINT8;
with per-group scales and zero points, G the smallest sub-block among the shards (16 or 32 columns),
so each shard decodes exactly. A layer with a float shard (F32, F16, BF16) is a float layer: its
quantized shards are dequantized (loader/gguf_loader.py does that before they reach the layer).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType
from torch import nn

from tritonllm.kernels.gguf_dequant import DECODED_TYPES, decode_gguf_planes
from tritonllm.kernels.quant_formats import FP4, INT4, MX_GROUP, UINT8, QuantizedWeight, QuantScheme
from tritonllm.quantization.config import LayerQuant
from tritonllm.quantization.methods import LinearMethod, copy_weight

FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
SUPPORTED_TYPES = (*FLOAT_TYPES, *DECODED_TYPES)


@dataclass
class GGUFWeight:
    """A quantized linear weight as the GGUF file stores it, decoded by the layer at load."""

    name: str  # the GGUF tensor's name (blk.0.attn_q.weight)
    qtype: GGMLQuantizationType
    shape: tuple[int, int]  # [rows, cols]: HF's [out_features, in_features]
    raw: np.ndarray  # uint8 [rows, cols / QK * TS]: the file's bytes (a memory map)
    row_order: np.ndarray | None = None  # HF row r is the file's row row_order[r] (llama's q/k permutation)

    def bytes_on(self, device: torch.device) -> torch.Tensor:
        """The block bytes, rows in HF's order, as a uint8 tensor on `device`."""
        raw = self.raw if self.row_order is None else self.raw[self.row_order]
        return torch.from_numpy(np.array(raw, dtype=np.uint8)).to(device)


def layer_quant_for(types: tuple[GGMLQuantizationType, ...]) -> LayerQuant | None:
    """How a linear layer whose shards have these GGUF types is stored (None: in float)."""
    if any(t in FLOAT_TYPES for t in types):
        return None
    if all(t == GGMLQuantizationType.MXFP4 for t in types):
        return LayerQuant(QuantScheme(FP4, "mx", "none"), False, packing="gguf")
    bits = max(DECODED_TYPES[t][0] for t in types)
    group = min(DECODED_TYPES[t][1] for t in types)
    scheme = QuantScheme(INT4 if bits <= 4 else UINT8, "group", "none", group_size=group)
    return LayerQuant(scheme, False, packing="gguf")


class GGUFMethod(LinearMethod):
    """A linear layer loaded from GGUF blocks: each shard's `weight` arrives as a GGUFWeight, and
    once all are in they are decoded into one QuantizedWeight (shards stacked along N)."""

    input_quant_fusable = False

    def __init__(self, layer_quant: LayerQuant) -> None:
        self.scheme = layer_quant.scheme
        self.format_name = layer_quant.scheme.format_name

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        group = MX_GROUP if self.scheme.weight_scale == "mx" else self.scheme.group_size
        if in_features % group:
            raise ValueError(
                f"{self.format_name} layer [{out_features}, {in_features}]: K is not a multiple of {group}"
            )
        # a placeholder named as the checkpoint's tensor (the model checks every one arrives), on
        # the model's device: the planes are allocated beside it once the shards are in
        layer.weight = nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
        layer.gguf_shards = []

    def load(self, layer: nn.Module, name: str, loaded: GGUFWeight | torch.Tensor, shard: tuple[int, int, int]) -> None:
        first, rows, _ = shard
        if name == "bias":
            copy_weight(layer.bias.data.narrow(0, first, rows), loaded, name)
        elif name == "weight" and isinstance(loaded, GGUFWeight):
            if loaded.shape != (rows, layer.in_features):
                raise ValueError(
                    f"GGUF tensor {loaded.name} is {list(loaded.shape)}, the layer's shard is [{rows}, {layer.in_features}]"
                )
            layer.gguf_shards.append((first, loaded))
        else:
            raise ValueError(f"{name}: a GGUF layer takes the file's quantized weight and a bias")

    def finish_loading(self, layer: nn.Module) -> None:
        n, k, device = layer.out_features, layer.in_features, layer.weight.device
        if self.scheme.weight_scale == "mx":
            data = torch.empty(n, k // 2, dtype=torch.uint8, device=device)
            scale = torch.empty(n, k // MX_GROUP, dtype=torch.uint8, device=device)
            zeros = None
        else:
            group = self.scheme.group_size
            data = torch.empty(n, k // 2 if self.scheme.packed else k, dtype=torch.uint8, device=device)
            scale = torch.empty(n, k // group, dtype=torch.float32, device=device)
            zeros = torch.empty_like(scale)
        for first, weight in layer.gguf_shards:
            rows = weight.shape[0]
            decode_gguf_planes(
                weight.bytes_on(device), weight.qtype, k, data.narrow(0, first, rows), scale.narrow(0, first, rows),
                None if zeros is None else zeros.narrow(0, first, rows), MX_GROUP if zeros is None else group,
            )  # fmt: skip
        layer.gguf = QuantizedWeight(self.scheme, data, scale, zeros=zeros)
        del layer.weight, layer.gguf_shards

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return layer.kernels.quantized_linear(x, layer.gguf, layer.bias)
