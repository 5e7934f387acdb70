"""Mixture-of-experts decoders: Mixtral, Qwen2-MoE, Qwen3-MoE and gpt-oss.

They are the Llama family's decoder (models/llama.py: attention with GQA, q/k norm, biases,
sliding windows and gpt-oss's sinks, all read from the config) with a sparse MoE block in place
of the dense MLP, on the layers the config makes sparse. The block: a router (a linear layer; HF's
`gate`, gpt-oss's `router` with a bias) scoring every expert, the FusedMoE layer (layers/moe.py:
top-k routing and the experts, one `moe` kernel op), and Qwen2-MoE's shared expert with its
sigmoid gate. What differs per architecture is read from the config into `MoESpec`. With tensor
parallelism the router is replicated and the experts (and the shared expert) split their
intermediate size across the ranks.

Checkpoint names: per expert (`experts.{e}.w1|w3|w2` in Mixtral's `block_sparse_moe`,
`experts.{e}.gate_proj|up_proj|down_proj` in Qwen's `mlp`) or stacked (gpt-oss:
`experts.gate_up_proj` [E, H, 2I] with gate and up columns interleaved, `experts.down_proj`
[E, I, H], their `_bias`, or MXFP4 `_blocks` / `_scales` as published).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig

from tritonllm.distributed.parallel_state import SINGLE, TensorParallel
from tritonllm.layers.linear import Linear
from tritonllm.layers.moe import FusedMoE
from tritonllm.models.llama import LlamaFamilyFlags, LlamaForCausalLM, LlamaMLP, MakeMLP, layer_quant
from tritonllm.quantization.config import QuantConfig

# HF expert tensor: (layer's mlp prefix, expert, projection, weight|bias)
_EXPERT = re.compile(r"(model\.layers\.\d+\.mlp)\.experts\.(\d+)\.(\w+)\.(weight\w*|bias)")
# stacked (gpt-oss): (layer's mlp prefix, gate_up_proj|down_proj, suffix)
_STACKED = re.compile(r"(model\.layers\.\d+\.mlp)\.experts\.(gate_up_proj|down_proj)(_bias|_blocks|_scales)?")
_SHARD = {"w1": "gate", "w3": "up", "w2": "down", "gate_proj": "gate", "up_proj": "up", "down_proj": "down"}


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    top_k: int
    intermediate_size: int
    renormalize: bool
    activation: str  # "silu" or gpt-oss's "swiglu_oai"
    router_name: str  # the router's attribute (HF name): "gate" or "router"
    router_bias: bool
    expert_bias: bool
    expert_names: tuple[str, str, str] | None  # per-expert (gate, up, down) names; None: stacked (gpt-oss)
    shared_intermediate_size: int = 0  # Qwen2-MoE's shared expert (0: none)
    alpha: float = 1.702
    limit: float = 7.0
    sparse_step: int = 1  # Qwen: decoder_sparse_step
    dense_layers: frozenset[int] = frozenset()  # Qwen: mlp_only_layers

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> MoESpec:
        kind = config.model_type
        if kind == "mixtral":
            return cls(config.num_local_experts, config.num_experts_per_tok, config.intermediate_size, True, "silu",
                       "gate", False, False, ("w1", "w3", "w2"))  # fmt: skip
        if kind in ("qwen2_moe", "qwen3_moe"):
            return cls(
                config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
                bool(config.norm_topk_prob), "silu", "gate", False, False, ("gate_proj", "up_proj", "down_proj"),
                getattr(config, "shared_expert_intermediate_size", 0) if kind == "qwen2_moe" else 0,
                sparse_step=getattr(config, "decoder_sparse_step", 1) or 1,
                dense_layers=frozenset(getattr(config, "mlp_only_layers", None) or ()),
            )  # fmt: skip
        if kind == "gpt_oss":
            return cls(config.num_local_experts, config.num_experts_per_tok, config.intermediate_size, True,
                       "swiglu_oai", "router", True, True, None,
                       # alpha: a config field in recent transformers, a constant (1.702) in the modeling code before
                       # limit: a config field (7.0 in gpt-oss's checkpoints); transformers 5.17's GptOssConfig
                       # has no such attribute, so a config it wrote lacks it: the modeling code's 7.0
                       alpha=getattr(config, "swiglu_alpha", 1.702), limit=getattr(config, "swiglu_limit", 7.0))  # fmt: skip
        raise ValueError(f"no mixture-of-experts layout for model_type {kind!r}")

    def is_sparse(self, layer: int) -> bool:
        return layer not in self.dense_layers and self.num_experts > 0 and (layer + 1) % self.sparse_step == 0


class SparseMoeBlock(nn.Module):
    def __init__(
        self, config: PretrainedConfig, spec: MoESpec, flags: LlamaFamilyFlags, dtype: torch.dtype,
        quant: QuantConfig | None, prefix: str, tp: TensorParallel = SINGLE,
    ) -> None:  # fmt: skip
        super().__init__()
        hidden = config.hidden_size
        self.router_name = spec.router_name
        # the router and the shared expert's gate stay unquantized, as quantized checkpoints ship them
        router = Linear(hidden, spec.num_experts, spec.router_bias, dtype)
        self.add_module(spec.router_name, router)
        self.experts = FusedMoE(
            spec.num_experts, spec.top_k, hidden, spec.intermediate_size, dtype, renormalize=spec.renormalize,
            activation=spec.activation, bias=spec.expert_bias, alpha=spec.alpha, limit=spec.limit,
            quant=layer_quant(quant, f"{prefix}.experts"), tp=tp,
        )  # fmt: skip
        self.expert_names = spec.expert_names
        self.shared_expert = self.shared_expert_gate = None
        if spec.shared_intermediate_size:
            self.shared_expert = LlamaMLP(config, flags, dtype, quant, f"{prefix}.shared_expert", tp,
                                          spec.shared_intermediate_size)  # fmt: skip
            self.shared_expert_gate = Linear(hidden, 1, False, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._experts(x, self.experts.route(x, getattr(self, self.router_name)))

    def forward_normed(
        self, hidden: torch.Tensor | None, residual: torch.Tensor, norm: nn.Module
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The block on norm(hidden + residual) (the decoder layer's post-attention norm; hidden None: the attention
        added its output into residual already): (its output, the new residual). The norm runs in the router's launch
        where the experts' route_normed takes it, else alone."""
        router = getattr(self, self.router_name)
        fused = None if hidden is None else self.experts.route_normed(hidden, residual, norm, router)
        if fused is None:
            x, residual = norm.deferred(hidden, residual, False)
            return self(x), residual
        route, x, residual = fused
        return self._experts(x, route), residual

    def _experts(self, x: torch.Tensor, route: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        out = self.experts(x, route)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out

    def checkpoint_names(self, prefix: str) -> set[str]:
        """The HF names of the experts' tensors under this block's `prefix`."""
        if self.expert_names is None:
            return {f"{prefix}.experts.{name}" for name in self.experts.stacked_checkpoint_names()}
        leaves = ["weight"] + (["bias"] if self.experts.w13_bias is not None else [])
        if self.experts.w13_scale is not None:
            leaves.append(self.experts.scale_name)
        return {
            f"{prefix}.experts.{e}.{proj}.{leaf}"
            for e in range(self.experts.num_experts)
            for proj in self.expert_names
            for leaf in leaves
        }


class MoEForCausalLM(LlamaForCausalLM):
    """Serves MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM and GptOssForCausalLM."""

    def __init__(
        self, config: PretrainedConfig, dtype: torch.dtype, device: torch.device | str, quant: QuantConfig | None = None,
        tp: TensorParallel = SINGLE,
    ) -> None:  # fmt: skip
        self.spec = MoESpec.from_config(config)
        super().__init__(config, dtype, device, quant, tp)

    def mlp_factory(self) -> MakeMLP:
        spec = self.spec

        def make(config, flags, dtype, quant, prefix, tp):  # noqa: ANN001, ANN202
            layer = int(prefix.split(".")[2])
            if spec.is_sparse(layer):
                return SparseMoeBlock(config, spec, flags, dtype, quant, prefix, tp)
            return LlamaMLP(config, flags, dtype, quant, prefix, tp)

        return make

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # Mixtral's block is `block_sparse_moe`, everyone else's `mlp`: ours is `mlp`
        super().load_weights((name.replace(".block_sparse_moe.", ".mlp."), t) for name, t in weights)
        for module in self.modules():
            if isinstance(module, FusedMoE):
                module.finish_loading()

    def load_special(self, name: str, tensor: torch.Tensor) -> bool:
        match = _EXPERT.fullmatch(name)
        if match is not None and match.group(3) in _SHARD:
            experts = self.get_submodule(f"{match.group(1)}.experts")
            experts.load_expert(int(match.group(2)), _SHARD[match.group(3)], match.group(4), tensor)
            return True
        match = _STACKED.fullmatch(name)
        if match is not None:
            experts = self.get_submodule(f"{match.group(1)}.experts")
            kind = "gate_up" if match.group(2) == "gate_up_proj" else "down"
            experts.load_stacked(f"{kind}{match.group(3) or ''}", tensor, interleaved=True, transposed=True)
            return True
        return False

    def _expected_checkpoint_names(self, params: dict[str, nn.Parameter]) -> set[str]:
        blocks = {name: m for name, m in self.named_modules() if isinstance(m, SparseMoeBlock)}
        ours = {n: p for n, p in params.items() if not any(n.startswith(f"{b}.experts.") for b in blocks)}
        expected = super()._expected_checkpoint_names(ours)
        for prefix, block in blocks.items():
            expected |= block.checkpoint_names(prefix)
        return expected
