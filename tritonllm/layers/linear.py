"""Linear layers with HF's weight layout [out_features, in_features], and fused variants.

HF checkpoints store q/k/v (and gate/up) as separate matrices; we keep each group in one fused
weight so a layer runs one GEMM instead of three (or two). `load_param` puts each HF tensor (a
weight, bias or scale shard) into its rows of the fused layer. What a layer stores and which kernel
it calls is its linear method's (quantization/methods.py): unquantized, quantized in the
checkpoint, or quantized online. Parameters are allocated uninitialised with torch.empty on the
current default device: models build their layers under `with torch.device(device)`.

Tensor parallelism (distributed/): a column-parallel layer holds 1/tp of the output rows (a fused
layer 1/tp of each part's rows, so a rank's q/k/v or gate/up are its heads' and its intermediate
slice), a row-parallel one 1/tp of the input columns and all-reduces its partial outputs, its
bias added on rank 0 only. Each loads only its rows or columns of the checkpoint tensors
(`rank_part`; the layer's method says how each tensor runs along them). With one rank they are
the plain layers: no collective, no slicing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tritonllm.distributed.parallel_state import SINGLE, TensorParallel
from tritonllm.distributed.shard import RankSlice
from tritonllm.kernels.quant_formats import OutputQuant
from tritonllm.kernels.registry import default_kernels
from tritonllm.loader.safetensors_loader import CheckpointSlice, materialize
from tritonllm.quantization.config import LayerQuant
from tritonllm.quantization.methods import Shard, make_method


@dataclass(frozen=True)
class NormedInput:
    """A linear layer's input given as `norm` (layers/norm.py's RMSNorm: its weight and eps) of the residual
    stream, not yet computed: the layer's kernels may normalize (and quantize) the stream inside its GEMM
    (linear's norm_linear); otherwise materialize() runs the norm's kernel (RMSNorm.deferred)."""

    stream: torch.Tensor
    norm: nn.Module

    def materialize(self) -> torch.Tensor:
        return self.norm(self.stream)


class Linear(nn.Module):
    """y = x @ weight.T (+ bias); weight [out_features, in_features], stored per `quant` (None:
    in `dtype`)."""

    # (WeightPrefetch, the next layer's tensors): started once this layer's kernel is queued (layers/prefetch.py)
    prefetch: tuple | None = None

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

    def input_quant(self, rows: int, ask: bool = True) -> OutputQuant:
        """How the op before quantizes this W8A8 layer's input of `rows` rows: as the linear implementation asks
        for it (its optional input_quant entry: FP8 per 1 x 128 group at decode sizes, EngineConfig.
        decode_group_quant) when `ask`, else as the scheme says."""
        asked = self.kernels.input_quant(rows, self.qweight) if ask else None
        return asked or OutputQuant.of(self.qweight)

    def forward(self, x: torch.Tensor | NormedInput) -> torch.Tensor:
        if isinstance(x, NormedInput):
            out = self.queued(self.method.apply_norm(self, x.stream, x.norm.weight, x.norm.eps))
            if out is not None:
                return out
            x = x.materialize()
        return self.queued(self.method.apply(self, x))

    def forward_residual(self, x: torch.Tensor, residual: torch.Tensor) -> bool:
        """residual += this layer applied to x, the add in the GEMM's epilogue where its method's kernels have
        one (linear's residual_linear): True; else False, with residual untouched."""
        return self.queued(self.method.apply_residual(self, x, residual)) is not None

    def forward_silu_mul(self, y: torch.Tensor) -> torch.Tensor | None:
        """This layer applied to silu(gate) * up of y = [gate | up] in one kernel call where its method's
        kernels have one (linear's silu_mul_linear), else None (layers/activation.py's SiluAndMul.mlp)."""
        return self.queued(self.method.apply_silu_mul(self, y))

    def queued(self, out: object) -> object:
        """Called with what this layer's kernel call returned (None: it did not run): then the next
        layer's weight prefetch, if linked (layers/prefetch.py); returns `out`."""
        if out is not None and self.prefetch is not None:
            owner, tensors = self.prefetch
            owner.fork(tensors)
        return out

    def shard(self, shard_id: str | None) -> Shard:
        """(first output row, rows, shard index) of a checkpoint shard; the whole layer for None."""
        if shard_id is not None:
            raise ValueError(f"shard {shard_id!r} of an unfused layer")
        return 0, self.out_features, 0

    def load_param(self, name: str, loaded: torch.Tensor | CheckpointSlice, shard_id: str | None = None) -> None:
        """Copy the checkpoint tensor `name` (weight, bias, weight_scale, ...) of shard `shard_id`
        (this rank's part of it, with tensor parallelism)."""
        self.method.load(self, name, self.rank_part(name, loaded, shard_id), self.shard(shard_id))

    def rank_part(self, name: str, loaded: torch.Tensor | CheckpointSlice, shard_id: str | None) -> torch.Tensor:
        """What this rank holds of checkpoint tensor `name`: all of it, the layer being whole."""
        return materialize(loaded)

    def finish_loading(self) -> None:
        """After every tensor is in: an online method quantizes, a checkpoint one assembles its weight."""
        self.method.finish_loading(self)


class ColumnParallelLinear(Linear):
    """A linear layer whose output rows are split across the tensor-parallel ranks: each computes its
    rows' outputs (no collective); out_features is the whole layer's."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype, quant: LayerQuant | None = None,
        tp: TensorParallel = SINGLE,
    ) -> None:  # fmt: skip
        self.tp = tp
        first, count = tp.share(out_features, "output rows")
        self.rank_rows = {None: RankSlice(first, count, out_features)}
        super().__init__(in_features, count, bias, dtype, quant)

    def rank_part(self, name: str, loaded: torch.Tensor | CheckpointSlice, shard_id: str | None) -> torch.Tensor:
        if self.tp.size == 1:
            return materialize(loaded)
        return self.method.rank_part(self, name, loaded, self.rank_rows[shard_id], None)


class RowParallelLinear(Linear):
    """A linear layer whose input columns are split across the tensor-parallel ranks: each multiplies
    its columns (of an input split the same way: a column-parallel layer's output) and the partial
    outputs are summed by an all-reduce; the bias lives on rank 0 only, so it is added once."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype, quant: LayerQuant | None = None,
        tp: TensorParallel = SINGLE,
    ) -> None:  # fmt: skip
        self.tp = tp
        first, count = tp.share(in_features, "input columns")
        self.rank_cols = RankSlice(first, count, in_features)
        super().__init__(count, out_features, bias and tp.rank == 0, dtype, quant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.queued(self.method.apply(self, x)))

    def forward_residual(self, x: torch.Tensor, residual: torch.Tensor) -> bool:
        # each rank's output is a partial sum: the residual would be added once a rank
        return self.tp.size == 1 and super().forward_residual(x, residual)

    def forward_silu_mul(self, y: torch.Tensor) -> torch.Tensor | None:
        out = super().forward_silu_mul(y)
        return None if out is None else self.tp.all_reduce(out)

    def load_param(self, name: str, loaded: torch.Tensor | CheckpointSlice, shard_id: str | None = None) -> None:
        if name == "bias" and self.bias is None:  # rank 0's
            return
        super().load_param(name, loaded, shard_id)

    def rank_part(self, name: str, loaded: torch.Tensor | CheckpointSlice, shard_id: str | None) -> torch.Tensor:
        if self.tp.size == 1:
            return materialize(loaded)
        return self.method.rank_part(self, name, loaded, None, self.rank_cols)


class MergedLinear(ColumnParallelLinear):
    """Several linear maps of the same input in one weight: rows are the shards, in order.

    shard_sizes maps each shard id (e.g. "gate", "up") to its number of output rows. Split across
    tensor-parallel ranks, each shard is split (a rank holds its rows of every shard, in order);
    `rank_rows` may say which rows of each shard a rank holds (default: an even split).
    """

    def __init__(
        self,
        in_features: int,
        shard_sizes: dict[str, int],
        bias: bool,
        dtype: torch.dtype,
        quant: LayerQuant | None = None,
        tp: TensorParallel = SINGLE,
        rank_rows: dict[str, RankSlice] | None = None,
    ) -> None:
        if rank_rows is None:
            rank_rows = {s: RankSlice(*tp.share(size, f"{s} rows"), size) for s, size in shard_sizes.items()}
        # set before Linear.__init__: the linear method's create_weights reads it (a plain dict
        # attribute needs no nn.Module state)
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        offset = 0
        for shard_id, part in rank_rows.items():
            self.shard_offsets[shard_id] = (offset, part.count)
            offset += part.count
        self.tp = tp
        self.rank_rows = rank_rows
        Linear.__init__(self, in_features, offset, bias, dtype, quant)

    def shard(self, shard_id: str | None) -> Shard:
        if shard_id is None:
            raise ValueError(f"a fused layer is loaded by shard ({list(self.shard_offsets)}), not whole")
        offset, size = self.shard_offsets[shard_id]
        return offset, size, list(self.shard_offsets).index(shard_id)

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The output columns of each shard, in order (views of y)."""
        return y.split([size for _, size in self.shard_offsets.values()], dim=-1)


class QKVLinear(MergedLinear):
    """q, k and v projections fused: rows [q (num_heads * head_dim) | k | v (num_kv_heads * head_dim each)];
    split across ranks by heads (TensorParallel.kv_head_share: KV heads replicated when fewer than ranks)."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool,
        dtype: torch.dtype,
        quant: LayerQuant | None = None,
        tp: TensorParallel = SINGLE,
    ) -> None:
        q_first, q_heads = tp.share(num_heads, "num_attention_heads")
        kv_first, kv_heads = tp.kv_head_share(num_kv_heads)
        q = RankSlice(q_first * head_dim, q_heads * head_dim, num_heads * head_dim)
        kv = RankSlice(kv_first * head_dim, kv_heads * head_dim, num_kv_heads * head_dim)
        shard_sizes = {"q": q.total, "k": kv.total, "v": kv.total}
        super().__init__(hidden_size, shard_sizes, bias, dtype, quant, tp, {"q": q, "k": kv, "v": kv})
