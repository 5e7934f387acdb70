"""A mixture-of-experts block's experts: routing and the fused expert computation (the `moe` op).

The experts' weights are stacked: w13 [E, 2I, H] holds each expert's gate rows then its up rows,
w2 [E, H, I] its down projection (HF's [out_features, in_features] per expert). Checkpoints store
them per expert (`experts.{e}.gate_proj.weight`, Mixtral's w1/w3/w2) or already stacked (gpt-oss:
[E, H, 2I] with gate and up columns interleaved); `load_expert` and `load_stacked` place either.
MXFP4 experts (gpt-oss) keep the published blocks
and scales as the kernels read them. The router's linear layer belongs to the model (its name and bias differ per architecture); this
layer takes its logits.

Tensor parallelism splits every expert's intermediate size: a rank holds its slice of each expert's
gate and up rows and the same columns of its down projection, and the ranks' outputs are summed by
an all-reduce (the down bias lives on rank 0 only). Routing is replicated: every rank computes it.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from tritonllm.distributed.parallel_state import SINGLE, TensorParallel
from tritonllm.distributed.shard import RankSlice, TensorDims, narrow_to_rank
from tritonllm.kernels.moe_route import FUSED_ROUTER_TOKENS
from tritonllm.kernels.quant_formats import BLOCK, FP4, FP8_DTYPES, MX_GROUP, QuantizedWeight, QuantScheme
from tritonllm.kernels.reference import MOE_ACTIVATIONS, MOE_SCORINGS
from tritonllm.kernels.registry import default_kernels
from tritonllm.quantization.config import LayerQuant
from tritonllm.quantization.quantize import quantize_experts

logger = logging.getLogger(__name__)

# a checkpoint's per-expert shard -> (stacked parameter, row block within the expert's rows)
EXPERT_SHARDS = {"gate": ("w13", 0), "up": ("w13", 1), "down": ("w2", 0)}


class FusedMoE(nn.Module):
    # (WeightPrefetch, the next linear layer's tensors): started once w13 is queued (layers/prefetch.py)
    prefetch: tuple | None = None
    # a WeightPrefetch: the routed experts' w2 prefetched while w13 runs (TRITONLLM_PREFETCH_EXPERTS, untimed)
    expert_prefetch = None

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        dtype: torch.dtype,
        *,
        renormalize: bool,
        scoring: str = "softmax",
        activation: str = "silu",
        bias: bool = False,
        alpha: float = 1.702,
        limit: float = 7.0,
        quant: LayerQuant | None = None,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        self.tp = tp
        first, intermediate_size = tp.share(intermediate_size, "the experts' intermediate size")
        self.rank_cols = RankSlice(first, intermediate_size, intermediate_size * tp.size)
        if scoring not in MOE_SCORINGS or activation not in MOE_ACTIVATIONS:
            raise ValueError(
                f"MoE scoring {scoring!r} / activation {activation!r}: not {MOE_SCORINGS} / {MOE_ACTIVATIONS}"
            )
        if not 0 < top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok {top_k} must be in 1..{num_experts} (the number of experts)")
        self.num_experts, self.top_k = num_experts, top_k
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.renormalize, self.scoring, self.activation = renormalize, scoring, activation
        self.alpha, self.limit = alpha, limit
        self.kernels = default_kernels()  # the engine binds its own (kernels/registry.py)
        # the router's linear layer and the routing in one kernel at decode sizes (EngineConfig.fuse_moe_router)
        self.fuse_router = False
        # with it, the decoder layer's residual add + RMSNorm before the block in that kernel (fuse_norm_into_router)
        self.fuse_norm = False

        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)

        # stored as the checkpoint ships them: the model's dtype, MXFP4 (gpt-oss: packed e2m1 bytes
        # [E, N, K / 2], e8m0 scales [E, N, K / 32]) or FP8 block-128 (Qwen3-FP8: e4m3 [E, N, K], float32
        # scales [E, N / 128, K / 128])
        # online quantization (quantization="fp8" / "mxfp4" on a float checkpoint): loaded in `dtype`,
        # quantized in finish_loading to the MoE kernels' FP8 block-128 or MXFP4 layout
        self.online_scheme = _online_expert_scheme(quant, hidden_size, intermediate_size)  # this rank's sizes
        self.scheme = _expert_scheme(quant, intermediate_size)
        self.scale_name = quant.scale_name if quant is not None else None
        shapes = {"w13": (2 * intermediate_size, hidden_size), "w2": (hidden_size, intermediate_size)}
        for name, (n, k) in shapes.items():
            data, scale = _expert_storage(self.scheme, num_experts, n, k, dtype)
            setattr(self, name, nn.Parameter(data, requires_grad=False))
            setattr(self, f"{name}_scale", None if scale is None else nn.Parameter(scale, requires_grad=False))
        self.w13_bias = param(num_experts, 2 * intermediate_size) if bias else None
        self.w2_bias = param(num_experts, hidden_size) if bias and tp.rank == 0 else None  # added once

    def route(self, x: torch.Tensor, router: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's top-k (weights, expert ids) from the router's linear layer on x [T, H]: with fuse_router
        and at most FUSED_ROUTER_TOKENS tokens (where it measured faster), one kernel where the moe
        implementation has one for the call (its router_route), else the layer's GEMM and then moe_route."""
        if self.fuse_router and x.shape[0] <= FUSED_ROUTER_TOKENS:
            route = self.kernels.router_route(x, router.weight, router.bias, self.top_k, self.renormalize,
                                              self.scoring)  # fmt: skip
            if route is not None:
                return route
        return self.kernels.moe_route(router(x), self.top_k, self.renormalize, self.scoring)

    def route_normed(
        self, x: torch.Tensor, residual: torch.Tensor, norm: nn.Module, router: nn.Module
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor] | None:
        """(route, normed, x + residual): the RMSNorm `norm` of the residual add x + residual and the route of
        its output in one launch (the moe op's norm_router_route), with fuse_router and fuse_norm where route takes
        the fused router; None where that does not serve the call (the caller then runs the norm, then route)."""
        if not (self.fuse_router and self.fuse_norm and x.shape[0] <= FUSED_ROUTER_TOKENS):
            return None
        fused = self.kernels.norm_router_route(x, residual, norm.weight, norm.eps, router.weight, router.bias,
                                               self.top_k, self.renormalize, self.scoring)  # fmt: skip
        return None if fused is None else (fused[:2], fused[2], fused[3])

    def forward(self, x: torch.Tensor, route: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x [T, H] and its route (self.route) -> the weighted sum of each token's top-k experts [T, H]."""
        weights, ids = route
        w13, w2 = self.w13, self.w2
        if self.scheme is not None:
            w13 = QuantizedWeight(self.scheme, self.w13, self.w13_scale)
            w2 = QuantizedWeight(self.scheme, self.w2, self.w2_scale)
        if self.expert_prefetch is not None:
            self.expert_prefetch.fork_experts([self.w2, getattr(self, "w2_scale", None)], ids)
        after_w13 = None
        if self.prefetch is not None:  # the next layer's weight streams into L2 while w2 runs (layers/prefetch.py)
            owner, tensors = self.prefetch
            after_w13 = lambda: owner.fork(tensors)  # noqa: E731
        out = self.kernels.fused_moe(
            x, w13, w2, weights, ids, activation=self.activation, w13_bias=self.w13_bias,
            w2_bias=self.w2_bias, alpha=self.alpha, limit=self.limit, after_w13=after_w13,
        )  # fmt: skip
        return self.tp.all_reduce(out)

    def finish_loading(self) -> None:
        """After every tensor is in: online quantization of the experts (per expert, stacked); then MXFP4
        experts' rows ROW_ALIGN bytes apart (aligned_rows)."""
        if self.online_scheme is not None:
            for name in ("w13", "w2"):
                q = quantize_experts(getattr(self, name).data, self.online_scheme)
                setattr(self, name, nn.Parameter(q.data, requires_grad=False))
                setattr(self, f"{name}_scale", nn.Parameter(q.scale, requires_grad=False))
            self.scheme, self.online_scheme = self.online_scheme, None
        if self.scheme is not None and not self.scheme.is_fp8:
            for name in ("w13", "w2"):
                setattr(self, name, nn.Parameter(aligned_rows(getattr(self, name).data), requires_grad=False))

    def load_expert(self, expert: int, shard: str, name: str, tensor: torch.Tensor) -> None:
        """Expert `expert`'s `shard` ("gate", "up" or "down") tensor `name` ("weight" or "bias")."""
        names = (
            ("weight", "bias", self.scale_name)
            if self.scheme is not None and self.scheme.is_fp8
            else ("weight", "bias")
        )
        if not 0 <= expert < self.num_experts or shard not in EXPERT_SHARDS or name not in names:
            raise ValueError(f"no expert tensor {expert}.{shard}.{name} ({self.num_experts} experts)")
        stacked, block = EXPERT_SHARDS[shard]
        suffix = {"weight": "", "bias": "_bias"}.get(name, "_scale")
        if (stacked, suffix) == ("w2", "_bias") and self.tp.rank > 0:  # rank 0's
            return
        target = getattr(self, stacked + suffix)
        if target is None:
            raise ValueError(f"expert {expert}'s {shard} has no {name}")
        if self.tp.size > 1:  # this rank's intermediate rows (gate, up) or columns (down); scales per 128
            unit = BLOCK if suffix == "_scale" else 1
            dims = TensorDims(0, None, unit) if stacked == "w13" else TensorDims(None, 1, 1, unit)
            rows, cols = (self.rank_cols, None) if stacked == "w13" else (None, self.rank_cols)
            tensor = narrow_to_rank(tensor, f"expert {expert} {shard}.{name}", dims, rows, cols)
        rows = self.intermediate_size if stacked == "w13" else self.hidden_size
        if suffix == "_scale":  # one row of scales per 128 rows (w13's shards start on a block: I % 128 == 0)
            rows = -(-rows // BLOCK)
            tensor = tensor.float()
        elif tensor.dtype != target.dtype and target.dtype in (torch.uint8, *FP8_DTYPES):
            raise ValueError(
                f"expert {expert} {shard}.{name}: the checkpoint stores {tensor.dtype}, expected {target.dtype}"
            )
        dest = target[expert, block * rows : (block + 1) * rows]
        _copy(dest, tensor, f"expert {expert} {shard}.{name}")

    def load_stacked(self, name: str, tensor: torch.Tensor, *, interleaved: bool, transposed: bool) -> None:
        """Every expert at once: `name` is "gate_up", "down", "gate_up_bias" or "down_bias", as [E, rows,
        cols] (`transposed`: [E, cols, rows], gpt-oss's in x out layout); `interleaved` gate_up
        alternates gate and up rows (gpt-oss) instead of gate rows then up rows."""
        if name == "down_bias" and self.tp.rank > 0:  # rank 0's
            return
        target = _STACKED_TARGETS.get(name)
        quantized = name.endswith(("_blocks", "_scales"))
        mxfp4 = self.scheme is not None and not self.scheme.is_fp8
        if quantized and not mxfp4 or name in ("gate_up", "down") and self.scheme is not None:
            target = None  # float weights into MXFP4 experts, or blocks into float ones
        target = None if target is None else getattr(self, target)
        if target is None:
            raise ValueError(
                f"no stacked expert tensor {name!r} in {'MXFP4' if self.scheme else 'unquantized'} experts"
            )
        if quantized:  # [E, N, K / 32, 16] blocks: the rows' bytes, as the kernels read them
            if tensor.dtype != torch.uint8:
                raise ValueError(f"{name}: MXFP4 blocks and scales are uint8, not {tensor.dtype}")
            tensor = tensor.reshape(*tensor.shape[:2], -1)
        elif transposed and tensor.dim() == 3:
            tensor = tensor.transpose(1, 2)
        if interleaved and name.startswith("gate_up"):  # rows g0 u0 g1 u1 ... -> g0 g1 ... u0 u1 ...
            tensor = torch.cat([tensor[:, 0::2], tensor[:, 1::2]], dim=1)
        if self.tp.size > 1:
            tensor = self._rank_part_stacked(name, tensor)
        _copy(target, tensor, name)

    def _rank_part_stacked(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of stacked tensor `name` laid out as the layer stores it ([E, 2I, ...] gate
        then up rows, [E, H, I (in bytes or scale groups)] down; the down bias whole)."""
        cols = self.rank_cols
        if name == "down_bias":
            return tensor
        if name.startswith("gate_up"):  # the rank's rows of the gate half and of the up half
            return torch.cat([half.narrow(1, cols.first, cols.count) for half in tensor.chunk(2, dim=1)], dim=1)
        # down's columns: bytes of packed pairs (MXFP4 blocks) or e8m0 scales per 32 (a rank's count of
        # columns is a multiple of 32 there: _expert_storage refuses others)
        unit = {"down_blocks": 2, "down_scales": MX_GROUP}.get(name, 1)
        return tensor.narrow(2, cols.first // unit, cols.count // unit)

    def stacked_checkpoint_names(self) -> list[str]:
        """The stacked checkpoint tensors (gpt-oss's names) this layer expects."""
        weights = ["gate_up_proj", "down_proj"]
        if self.scheme is not None:  # MXFP4 (stacked FP8 experts are no published layout)
            weights = [f"{w}_{part}" for w in weights for part in ("blocks", "scales")]
        return weights + (["gate_up_proj_bias", "down_proj_bias"] if self.w13_bias is not None else [])


# load_stacked's names (a checkpoint's gate_up_proj{,_bias,_blocks,_scales} less "_proj") -> our tensor
_STACKED_TARGETS = {
    "gate_up": "w13", "down": "w2", "gate_up_bias": "w13_bias", "down_bias": "w2_bias",
    "gate_up_blocks": "w13", "gate_up_scales": "w13_scale", "down_blocks": "w2", "down_scales": "w2_scale",
}  # fmt: skip


def _expert_scheme(quant: LayerQuant | None, intermediate_size: int) -> QuantScheme | None:
    """The experts' storage as the checkpoint ships them: None (the model's dtype; also under online
    quantization, which finish_loading applies), MXFP4 as gpt-oss publishes it, or FP8 block-128 as
    Qwen3-FP8 does; other formats are refused by name."""
    if quant is None or quant.online:
        return None
    scheme = quant.scheme
    fp8_block = scheme.is_fp8 and scheme.weight_scale == "block"
    if quant.packing != "mxfp4" and not fp8_block:
        raise ValueError(
            f"quantized MoE experts in format {scheme.format_name} are not supported yet (MXFP4 experts as gpt-oss "
            "ships them and FP8 block-128 experts as Qwen3-FP8 does are); serve the unquantized checkpoint"
        )
    if fp8_block and (
        intermediate_size % BLOCK or (quant.checkpoint_dtype or scheme.weight_dtype) != scheme.weight_dtype
    ):
        raise ValueError(
            f"FP8 block experts need an expert intermediate size that is a multiple of {BLOCK} (got "
            f"{intermediate_size}) and an e4m3 checkpoint this GPU computes in"
        )
    return scheme


def _online_expert_scheme(quant: LayerQuant | None, hidden: int, intermediate: int) -> QuantScheme | None:
    """The experts' layout under online quantization: MXFP4 for quantization="mxfp4", FP8 block-128 for
    "fp8" (the MoE kernels' FP8 format; needs both sizes multiples of 128); other methods (int8, int4,
    mxfp8) and sizes leave the experts in the model's dtype, logged."""
    if quant is None or not quant.online:
        return None
    scheme = quant.scheme
    if scheme.weight_dtype == FP4 and hidden % MX_GROUP == 0 and intermediate % MX_GROUP == 0:
        return scheme
    if scheme.is_fp8 and scheme.weight_scale == "channel" and hidden % BLOCK == 0 and intermediate % BLOCK == 0:
        return QuantScheme(scheme.weight_dtype, "block", "group")
    logger.warning(
        "online %s: MoE experts [%d x %d] stay unquantized (the fused MoE quantizes experts online to FP8 "
        "block-128 or MXFP4 only, at sizes that are multiples of 128 / 32)", scheme.format_name, hidden, intermediate,
    )  # fmt: skip
    return None


# MXFP4 expert rows start this many bytes apart (16 int32 words): the GEMV's compiler then knows each row
# 16-byte aligned and loads its words 16 bytes at a time. gpt-oss's 1,440-byte rows (K = 2880) otherwise
# took 4-byte loads and a cross-thread sum every K step (sm90 SASS: 863 instructions a step of w2 against 732)
ROW_ALIGN = 64


def aligned_rows(t: torch.Tensor) -> torch.Tensor:
    """t [..., N, B] with the same values, its rows ROW_ALIGN bytes apart (a view of zero-padded storage;
    t itself where they already are). The kernels read the rows' first B bytes, through the strides."""
    if t.stride(-1) == 1 and (t.stride(-2) * t.element_size()) % ROW_ALIGN == 0:
        return t
    padded = -(-t.shape[-1] * t.element_size() // ROW_ALIGN) * ROW_ALIGN // t.element_size()
    out = torch.zeros(*t.shape[:-1], padded, dtype=t.dtype, device=t.device)
    out[..., : t.shape[-1]] = t
    return out[..., : t.shape[-1]]


def _expert_storage(
    scheme: QuantScheme | None, experts: int, n: int, k: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weights, scales) of `experts` [n, k] matrices in `scheme`'s storage (None: `dtype`, no scales)."""
    if scheme is None:
        return torch.empty(experts, n, k, dtype=dtype), None
    if scheme.is_fp8:  # block-128
        return torch.empty(experts, n, k, dtype=scheme.weight_dtype), torch.empty(
            experts, -(-n // BLOCK), -(-k // BLOCK), dtype=torch.float32
        )
    if k % MX_GROUP:
        raise ValueError(f"MXFP4 experts: K ({k}) must be a multiple of {MX_GROUP}")
    return torch.empty(experts, n, k // 2, dtype=torch.uint8), torch.empty(experts, n, k // MX_GROUP, dtype=torch.uint8)


def _copy(dest: torch.Tensor, tensor: torch.Tensor, what: str) -> None:
    if tuple(tensor.shape) != tuple(dest.shape):
        raise ValueError(f"{what}: shape {tuple(tensor.shape)} does not match the layer's {tuple(dest.shape)}")
    dest.copy_(tensor)
