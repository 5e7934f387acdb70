"""Linear methods: what a linear layer stores, how checkpoint tensors fill it, and which kernel
entry point it calls (layers/linear.py owns one).

- `UnquantizedMethod`: a `weight` [N, K] in the model's dtype; `kernels.linear`.
- `CheckpointQuantMethod`: the checkpoint's quantized `weight` [N, K], its weight scales (named as
  the checkpoint names them), and `input_scale` for static activations; `kernels.quantized_linear`.
- `OnlineQuantMethod`: loads the float weight like an unquantized layer, then quantizes it once
  loading is done (quantization/quantize.py) and frees the float copy.

Fused layers (q/k/v, gate/up) hold several checkpoint shards in one weight. Their shards may carry
different per-tensor scales, so scales are kept per output row: a per-tensor scale fills its
shard's rows, a per-channel one is copied, a 128 x 128 block grid is placed at its shard's block
rows (shards must start on a multiple of 128 rows). Static input scales of a fused layer's shards
(one input, several calibrations) are combined by their maximum, as vLLM does.

With tensor parallelism a layer holds some of its rows or columns: each method says along which
dims its checkpoint tensors run (`shard_dims`, distributed/shard.py), and a rank reads its part.
"""

from __future__ import annotations

import torch
from torch import nn

from tritonllm.distributed.shard import WHOLE, RankSlice, TensorDims, narrow_to_rank
from tritonllm.kernels.quant_formats import BLOCK, FUSABLE_ACTS, OutputQuant, QuantizedWeight
from tritonllm.quantization.config import LayerQuant
from tritonllm.quantization.quantize import quantize_weight

Shard = tuple[int, int, int]  # (first output row, rows, index of the shard)


def _param(shape: tuple[int, ...], dtype: torch.dtype, fill: float | None = None) -> nn.Parameter:
    t = torch.empty(shape, dtype=dtype) if fill is None else torch.full(shape, fill, dtype=dtype)
    return nn.Parameter(t, requires_grad=False)


def copy_weight(param: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
    """Copy a checkpoint tensor into (a slice of) a preallocated parameter, casting dtype and moving
    device; a shape mismatch is refused naming the tensor."""
    if param.shape != loaded.shape:
        raise ValueError(
            f"{name}: the checkpoint's shape {tuple(loaded.shape)} is not the model's {tuple(param.shape)}"
        )
    param.copy_(loaded)


class LinearMethod:
    """What every linear method shares: reading a tensor-parallel rank's part of a checkpoint tensor."""

    format_name: str

    def apply_gated(self, layer: nn.Module, x: torch.Tensor, quant: OutputQuant | None) -> torch.Tensor | None:
        """silu(gate) * up of this gate_up layer's output in one kernel (quantized per `quant`), or None where
        the kernels have none for this format (layers/activation.py's SiluAndMul.gated)."""
        return None

    def apply_silu_mul(self, layer: nn.Module, y: torch.Tensor) -> torch.Tensor | None:
        """This layer applied to silu(gate) * up of y = [gate | up] in one kernel call, or None where the
        kernels have none for this format (layers/activation.py's SiluAndMul.mlp)."""
        return None

    def apply_norm(
        self, layer: nn.Module, x: torch.Tensor, norm_weight: torch.Tensor, eps: float
    ) -> torch.Tensor | None:
        """This layer applied to the RMSNorm (norm_weight, eps) of the residual stream x in one kernel call, or
        None where the kernels have none for this format (layers/linear.py's Linear.forward)."""
        return None

    def apply_residual(self, layer: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor | None:
        """residual += this layer's output, in its kernel: residual; or None (untouched) where the kernels have
        none for this format (Linear.forward_residual)."""
        return None

    def apply_gated_mlp(
        self, layer: nn.Module, down: nn.Module, x: torch.Tensor, norm_weight: torch.Tensor | None, eps: float,
        residual: torch.Tensor | None,
    ) -> torch.Tensor | None:  # fmt: skip
        """down(silu(gate) * up of this gate_up layer applied to x) with no activation kernel between the GEMMs
        (x: its input, or with norm_weight the residual stream to normalize; residual: down's output added into
        it, and residual returned), or None where the kernels have none for these formats (SiluAndMul.mlp)."""
        return None

    def shard_dims(self, name: str, shape: torch.Size) -> TensorDims:
        """Along which dims checkpoint tensor `name` runs over the layer's rows and columns."""
        raise ValueError(
            f"{name}: {self.format_name} layers cannot be split across tensor-parallel ranks: use "
            "tensor_parallel_size=1 or a checkpoint in another format"
        )

    def rank_part(
        self, layer: nn.Module, name: str, loaded: torch.Tensor, rows: RankSlice | None, cols: RankSlice | None
    ) -> torch.Tensor:
        """This rank's part of checkpoint tensor `name`: output `rows` (column-parallel) or input `cols`
        (row-parallel) of the layer."""
        return narrow_to_rank(loaded, name, self.shard_dims(name, loaded.shape), rows, cols)


class UnquantizedMethod(LinearMethod):
    format_name = "float"
    # whether the op before the layer may quantize its input (per token, with the static input_scale,
    # or per 1 x 128 group) in its own kernel: RMSNorm / SiLU-mul with quantization fused in
    input_quant_fusable = False

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        layer.weight = _param((out_features, in_features), dtype)

    def shard_dims(self, name: str, shape: torch.Size) -> TensorDims:
        return TensorDims(0, 1 if len(shape) == 2 else None)  # weight [N, K], bias [N]

    def load(self, layer: nn.Module, name: str, loaded: torch.Tensor, shard: Shard) -> None:
        first, rows, _ = shard
        copy_weight(getattr(layer, name).data.narrow(0, first, rows), loaded, name)

    def finish_loading(self, layer: nn.Module) -> None:
        pass

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return layer.kernels.linear(x, layer.weight, layer.bias)

    def apply_gated(self, layer: nn.Module, x: torch.Tensor, quant: OutputQuant | None) -> torch.Tensor | None:
        return layer.kernels.gated_linear(x, layer.weight, layer.bias, quant)


class QuantizedWeightCalls:
    """The kernel calls of a method whose loaded layer holds a QuantizedWeight (`layer.qweight`)."""

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return layer.kernels.quantized_linear(x, layer.qweight, layer.bias)

    def apply_gated(self, layer: nn.Module, x: torch.Tensor, quant: OutputQuant | None) -> torch.Tensor | None:
        return layer.kernels.gated_linear(x, layer.qweight, layer.bias, quant)

    def apply_silu_mul(self, layer: nn.Module, y: torch.Tensor) -> torch.Tensor | None:
        return layer.kernels.silu_mul_linear(y, layer.qweight, layer.bias)

    def apply_norm(
        self, layer: nn.Module, x: torch.Tensor, norm_weight: torch.Tensor, eps: float
    ) -> torch.Tensor | None:
        return layer.kernels.norm_linear(x, norm_weight, eps, layer.qweight, layer.bias)

    def apply_residual(self, layer: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor | None:
        return layer.kernels.residual_linear(x, layer.qweight, layer.bias, residual)

    def apply_gated_mlp(
        self, layer: nn.Module, down: nn.Module, x: torch.Tensor, norm_weight: torch.Tensor | None, eps: float,
        residual: torch.Tensor | None,
    ) -> torch.Tensor | None:  # fmt: skip
        down_weight = getattr(down, "qweight", None)
        if down_weight is None:
            return None
        return layer.kernels.gated_mlp_linear(x, norm_weight, eps, layer.qweight, layer.bias, down_weight, down.bias,
                                              residual)  # fmt: skip


class OnlineQuantMethod(QuantizedWeightCalls, UnquantizedMethod):
    """Float weights loaded as they are, quantized once loading is done."""

    def __init__(self, layer_quant: LayerQuant) -> None:
        self.layer_quant = layer_quant
        self.format_name = layer_quant.scheme.format_name
        self.input_quant_fusable = layer_quant.scheme.act in FUSABLE_ACTS

    def finish_loading(self, layer: nn.Module) -> None:
        layer.qweight = quantize_weight(layer.weight.data, self.layer_quant.scheme)
        del layer.weight  # the float copy is not kept


class CheckpointQuantMethod(QuantizedWeightCalls, LinearMethod):
    """A layer quantized in the checkpoint (quantization/config.py lists the published layouts)."""

    def __init__(self, layer_quant: LayerQuant) -> None:
        self.layer_quant = layer_quant
        self.scheme = layer_quant.scheme
        self.format_name = layer_quant.scheme.format_name
        self.input_quant_fusable = layer_quant.scheme.act in FUSABLE_ACTS

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        lq = self.layer_quant
        layer.weight = _param((out_features, in_features), lq.checkpoint_dtype or self.scheme.weight_dtype)
        if self.scheme.weight_scale == "block":
            grid = (-(-out_features // BLOCK), -(-in_features // BLOCK))
            setattr(layer, lq.scale_name, _param(grid, torch.float32))
        else:
            setattr(layer, lq.scale_name, _param((out_features,), torch.float32))
        if lq.static_input:
            num_shards = len(getattr(layer, "shard_offsets", None) or [None])
            layer.input_scale = _param((num_shards,), torch.float32, fill=0.0)

    def shard_dims(self, name: str, shape: torch.Size) -> TensorDims:
        if name == "weight":
            return TensorDims(0, 1)
        if name == self.layer_quant.scale_name and self.scheme.weight_scale == "block":
            return TensorDims(0, 1, BLOCK, BLOCK)
        if name in ("input_scale", "bias") or name.endswith("zero_point") or shape.numel() == 1:
            return TensorDims(0, None) if name == "bias" else WHOLE  # per-tensor scales: every rank's
        return TensorDims(0, None)  # per-channel scales [N]

    def load(self, layer: nn.Module, name: str, loaded: torch.Tensor, shard: Shard) -> None:
        first, rows, index = shard
        lq = self.layer_quant
        if name.endswith("zero_point"):  # symmetric schemes may still ship all-zero zero points
            if loaded.count_nonzero():
                raise ValueError(f"{name}: non-zero zero points (asymmetric quantization) are not supported")
            return
        if name == "weight":
            if loaded.dtype != layer.weight.dtype:
                raise ValueError(f"{name}: the checkpoint stores {loaded.dtype}, expected {layer.weight.dtype}")
            copy_weight(layer.weight.data.narrow(0, first, rows), loaded, name)
        elif name == lq.scale_name and self.scheme.weight_scale == "block":
            if first % BLOCK:
                raise ValueError(f"{name}: a fused shard starts at row {first}, not on a 128-row block boundary")
            param = getattr(layer, name).data
            copy_weight(param.narrow(0, first // BLOCK, loaded.shape[0]), loaded.float(), name)
        elif name == lq.scale_name:
            param = getattr(layer, name).data.narrow(0, first, rows)
            if loaded.numel() == 1:  # per-tensor: every row of the shard
                param.fill_(loaded.float().reshape(()).item())
            else:
                copy_weight(param, loaded.float().reshape(-1), name)
        elif name == "input_scale":
            layer.input_scale.data[index] = loaded.float().reshape(())
        elif name == "bias":
            copy_weight(layer.bias.data.narrow(0, first, rows), loaded, name)
        else:
            raise ValueError(f"{name}: no such tensor in a {self.format_name} layer")

    def finish_loading(self, layer: nn.Module) -> None:
        weight, scale = layer.weight.data, getattr(layer, self.layer_quant.scale_name).data
        if weight.dtype != self.scheme.weight_dtype:  # e4m3fn checkpoint on an e4m3fnuz GPU (MI300)
            weight, scale = _e4m3fn_to_fnuz(weight, scale)
        input_scale = layer.input_scale.data.amax().reshape(1) if self.layer_quant.static_input else None
        layer.qweight = QuantizedWeight(self.scheme, weight, scale, input_scale)


def _e4m3fn_to_fnuz(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same values in e4m3fnuz (exponent bias 8): the bits read as fnuz are half the value, so the
    scale doubles; the bit pattern 0x80 (-0 in fn) is NaN in fnuz and becomes 0."""
    bits = weight.view(torch.int8).clone()
    bits[bits == -128] = 0
    return bits.view(torch.float8_e4m3fnuz), scale * 2.0


def make_method(layer_quant: LayerQuant | None):
    if layer_quant is None:
        return UnquantizedMethod()
    if layer_quant.online:
        return OnlineQuantMethod(layer_quant)
    if layer_quant.packing == "gguf":  # llama.cpp's blocks, decoded at load (quantization/gguf.py)
        from tritonllm.quantization.gguf import GGUFMethod

        return GGUFMethod(layer_quant)
    if layer_quant.packing == "mxfp4":
        from tritonllm.quantization.mxfp4 import Mxfp4Method

        return Mxfp4Method(layer_quant)
    if layer_quant.scheme.weight_scale == "group":  # GPTQ's, AWQ's or compressed-tensors' packed layouts
        from tritonllm.quantization.awq import AWQMethod  # (these modules use copy_weight from here)
        from tritonllm.quantization.ct_packed import PackQuantizedMethod
        from tritonllm.quantization.gptq import GPTQMethod

        if layer_quant.packing == "awq":
            return AWQMethod(layer_quant)
        return PackQuantizedMethod(layer_quant) if layer_quant.packing.startswith("ct") else GPTQMethod(layer_quant)
    return CheckpointQuantMethod(layer_quant)
