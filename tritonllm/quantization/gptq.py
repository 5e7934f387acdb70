"""GPTQ checkpoints (`quant_method: "gptq"`, AutoGPTQ / GPTQModel layout), 4- and 8-bit, read as
published and converted once at load into the kernels' int4 (4-bit) or uint8 (8-bit) grouped layout
(kernels/quant_formats.py).

Published tensors of a linear layer with N outputs and K inputs, G columns a group (K when
`group_size` is -1), b = 4 or 8 bits:
- `qweight` int32 [K * b / 32, N]: 32 / b values of consecutive input columns per int32, the
  first in the lowest bits;
- `qzeros` int32 [K / G, N * b / 32]: the zero points, packed the same way along N;
- `scales` float16 [K / G, N];
- `g_idx` int32 [K]: the group of each input column (not k // G with `desc_act`: act order).
w[n, k] = (q - zero) * scale of group g_idx[k]. Checkpoints in the original format
(`checkpoint_format` "gptq", the default) store zero - 1; "gptq_v2" stores the zero itself.

At load: the values are unpacked to [N, K] (4-bit: packed two a byte); with act order, the input columns
are sorted by group once (the groups are then contiguous runs of G) and the layer permutes its
activations' columns the same way before the GEMM. Fused layers (q/k/v, gate/up) share their input,
so GPTQ's act order (from the input's statistics) gives their shards one g_idx; shards that differ
are refused.
"""

from __future__ import annotations

import torch
from torch import nn

from tritonllm.distributed.shard import WHOLE, RankSlice, TensorDims, narrow_to_rank
from tritonllm.kernels.quant_formats import INT4, UINT8, QuantizedWeight, QuantScheme, pack_int4
from tritonllm.quantization.config import LayerQuant
from tritonllm.quantization.methods import LinearMethod, copy_weight

BITS = 4
PER_INT32 = 32 // BITS  # 4-bit values per int32 (AWQ and pack-quantized are 4-bit only)
BITS_OF = {INT4: 4, UINT8: 8}  # the kernels' weight dtype of each GPTQ width
SCALE_DTYPE = torch.float16  # group scales and zero points as the kernels read them


def unpack_int32(packed: torch.Tensor, dim: int, bits: int = BITS) -> torch.Tensor:
    """int32 words holding 32 / bits values (the first in the lowest bits) -> the values, unpacked
    along `dim` (0: qweight's K, 1: qzeros' N), as int16 0..2**bits - 1."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=packed.device)
    mask = (1 << bits) - 1
    if dim == 0:
        values = (packed[:, None, :] >> shifts[None, :, None]) & mask
        return values.reshape(-1, packed.shape[1]).to(torch.int16)
    values = (packed[:, :, None] >> shifts[None, None, :]) & mask
    return values.reshape(packed.shape[0], -1).to(torch.int16)


def pack_int32(values: torch.Tensor, dim: int, bits: int = BITS) -> torch.Tensor:
    """unpack_int32's inverse: values (0..2**bits - 1) packed 32 / bits to an int32 along `dim`."""
    v = values.to(torch.int64)
    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    per = 32 // bits
    if dim == 0:
        words = (v.view(-1, per, v.shape[1]) << shifts[None, :, None]).sum(1)
    else:
        words = (v.view(v.shape[0], -1, per) << shifts[None, None, :]).sum(2)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # the same 32 bits, signed


class GPTQMethod(LinearMethod):
    """A layer stored as GPTQ tensors; assembled into a QuantizedWeight (int4 or uint8, per-group
    scales and zero points, optional input-column permutation) once every shard is in."""

    input_quant_fusable = False
    ACT_ORDER = "g_idx"  # the tensor of each input column's group

    def shard_dims(self, name: str, shape: torch.Size) -> TensorDims:
        group = self.scheme.group_size
        k_dim = 0 if group > 0 else None  # group -1: one group of all K, each rank needs all of it
        dims = {
            "qweight": TensorDims(1, 0, 1, self.per_int32),
            "qzeros": TensorDims(1, k_dim, self.per_int32, group),
            "scales": TensorDims(1, k_dim, 1, group),
            "bias": TensorDims(0, None),
        }
        return dims.get(name, WHOLE)

    def rank_part(
        self, layer: nn.Module, name: str, loaded: torch.Tensor, rows: RankSlice | None, cols: RankSlice | None
    ) -> torch.Tensor:
        if name != self.ACT_ORDER or cols is None or not cols.is_split:
            return super().rank_part(layer, name, loaded, rows, cols)
        # a row-parallel rank's columns: their groups must be its own contiguous run (no act order)
        group = self.scheme.group_size if self.scheme.group_size > 0 else cols.total
        g_idx = narrow_to_rank(loaded, name, TensorDims(None, 0), None, cols)
        plain = torch.arange(cols.first, cols.first + cols.count, dtype=g_idx.dtype) // group
        if cols.first % group and group < cols.total or not torch.equal(g_idx, plain):
            raise ValueError(
                f"{name}: act order (desc_act) groups cannot be split across tensor-parallel ranks along the "
                "input: use tensor_parallel_size=1 or a checkpoint without act order"
            )
        return torch.arange(cols.count, dtype=g_idx.dtype) // layer.gptq_group

    def __init__(self, layer_quant: LayerQuant) -> None:
        self.layer_quant = layer_quant
        self.scheme = layer_quant.scheme
        self.format_name = layer_quant.scheme.format_name
        self.bits = BITS_OF[self.scheme.weight_dtype]
        self.per_int32 = 32 // self.bits

    def group_of(self, layer: nn.Module, in_features: int, out_features: int, packed_k: bool, packed_n: bool) -> int:
        """The layer's group size (K for -1), checked against its shape and packing; kept on the layer."""
        group = self.scheme.group_size if self.scheme.group_size > 0 else in_features
        k_mult, n_mult = self.per_int32 if packed_k else 1, self.per_int32 if packed_n else 1
        if in_features % group or in_features % k_mult or out_features % n_mult:
            raise ValueError(
                f"{self.format_name} layer [{out_features}, {in_features}]: K must be a multiple of the group size "
                f"({group}) and of {k_mult}, N of {n_mult}"
            )
        layer.gptq_group = group
        return group

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        groups = in_features // self.group_of(layer, in_features, out_features, packed_k=True, packed_n=True)
        layer.qweight = int32_param(in_features // self.per_int32, out_features)
        layer.qzeros = int32_param(groups, out_features // self.per_int32)
        layer.scales = nn.Parameter(torch.empty(groups, out_features, dtype=SCALE_DTYPE), False)
        layer.g_idx = int32_param(in_features, fill=-1)

    def load(self, layer: nn.Module, name: str, loaded: torch.Tensor, shard: tuple[int, int, int]) -> None:
        first, rows, _ = shard
        if name in ("qweight", "scales"):
            copy_weight(getattr(layer, name).data.narrow(1, first, rows), loaded, name)
        elif name == "qzeros":
            load_packed_columns(layer.qzeros.data, loaded, first, rows, name, self.per_int32)
        elif name == "g_idx":
            load_act_order(layer.g_idx.data, loaded, name)
        elif name == "bias":
            copy_weight(layer.bias.data.narrow(0, first, rows), loaded, name)
        else:
            raise ValueError(f"{name}: no such tensor in a GPTQ layer (qweight, qzeros, scales, g_idx, bias)")

    TENSORS = ("qweight", "qzeros", "scales", "g_idx")  # the published tensors, freed once assembled

    def unpacked(self, layer: nn.Module) -> tuple[torch.Tensor, ...]:
        """(values [N, K], zero points [N, K / G], scales [N, K / G], g_idx [K] or None) from the
        layer's published tensors."""
        q = unpack_int32(layer.qweight.data, 0, self.bits).T
        zeros = (unpack_int32(layer.qzeros.data, 1, self.bits) + self.layer_quant.zero_offset).T
        g_idx = layer.g_idx.data
        return q, zeros, layer.scales.data.T, None if (g_idx < 0).any() else g_idx

    def finish_loading(self, layer: nn.Module) -> None:
        q, zeros, scales, g_idx = self.unpacked(layer)
        # float16, as published: half the bytes of float32 for the GEMV to read; zero points are small integers
        zeros, scales = zeros.to(SCALE_DTYPE).contiguous(), scales.to(SCALE_DTYPE).contiguous()
        k, group = q.shape[1], layer.gptq_group
        if g_idx is None:  # no g_idx in the checkpoint: groups in column order
            g_idx = torch.arange(k, dtype=torch.int32, device=q.device) // group
        perm = None
        if not torch.equal(g_idx, torch.arange(k, dtype=g_idx.dtype, device=g_idx.device) // group):
            counts = torch.bincount(g_idx.long(), minlength=k // group)
            if (counts != group).any():
                raise ValueError(f"g_idx: every group must hold {group} columns, got counts {counts.tolist()[:8]}...")
            perm = torch.argsort(g_idx, stable=True)
            q = q[:, perm]
        scheme = QuantScheme(self.scheme.weight_dtype, "group", "none", group_size=group)
        data = pack_int4(q.contiguous()) if scheme.packed else q.to(torch.uint8).contiguous()
        layer.gptq = QuantizedWeight(scheme, data, scales, zeros=zeros, perm=perm)
        for name in self.TENSORS:
            if hasattr(layer, name):
                delattr(layer, name)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return layer.kernels.quantized_linear(x, layer.gptq, layer.bias)


def int32_param(*shape: int, fill: int | None = None) -> nn.Parameter:
    t = torch.empty(shape, dtype=torch.int32) if fill is None else torch.full(shape, fill, dtype=torch.int32)
    return nn.Parameter(t, requires_grad=False)


def load_packed_columns(
    param: torch.Tensor, loaded: torch.Tensor, first: int, rows: int, name: str, per_int32: int = PER_INT32
) -> None:
    """Copy a fused layer's shard (output rows first..first + rows) into a tensor packed `per_int32`
    outputs to an int32 along dim 1."""
    if first % per_int32 or rows % per_int32:
        raise ValueError(f"{name}: a fused shard at rows {first}..{first + rows} splits a packed word")
    copy_weight(param.narrow(1, first // per_int32, rows // per_int32), loaded, name)


def load_act_order(param: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
    """Copy a shard's g_idx; the shards of a fused layer share their input, so they must agree."""
    if (param >= 0).any() and not torch.equal(param, loaded.to(param.device, param.dtype)):
        raise ValueError(f"{name}: the fused shards of one input have different act orders")
    copy_weight(param, loaded, name)


def gptq_tensors(
    weight: torch.Tensor, group_size: int, act_order: torch.Tensor | None = None, v1_zeros: bool = True, bits: int = 4
) -> dict[str, torch.Tensor]:
    """A float weight [N, K] as GPTQ's published tensors (round-to-nearest per group, asymmetric;
    with `act_order`, a permutation of the K columns, the groups follow it as GPTQ's desc_act does):
    the tests' fixtures. Zeros are stored minus 1 in the original format (`v1_zeros`)."""
    from tritonllm.kernels.quant_formats import unpack_int4
    from tritonllm.quantization.quantize import quantize_weight  # the grouped rule, applied in act order

    n, k = weight.shape
    group = group_size if group_size > 0 else k
    order = act_order if act_order is not None else torch.arange(k)
    dtype = {b: d for d, b in BITS_OF.items()}[bits]
    qw = quantize_weight(weight[:, order], QuantScheme(dtype, "group", "none", group_size=group))
    q_sorted = (unpack_int4(qw.data) if bits == 4 else qw.data).to(torch.int16)
    q = torch.empty_like(q_sorted)
    q[:, order] = q_sorted  # back to column order
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[order] = (torch.arange(k) // group).to(torch.int32)
    zeros = qw.zeros.T.to(torch.int16) - (1 if v1_zeros else 0)  # [K / G, N]
    return {
        "qweight": pack_int32(q.T.contiguous(), 0, bits),
        "qzeros": pack_int32(zeros.clamp(min=0), 1, bits),
        "scales": qw.scale.T.to(torch.float16).contiguous(),
        "g_idx": g_idx,
    }
