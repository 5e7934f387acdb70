"""One decoder-only family: Llama (incl. Llama 3.1 RoPE scaling), Mistral, Qwen2 and Qwen3.

They differ only by flags read from the HF config (`LlamaFamilyFlags`): biases on q/k/v (Qwen2),
RMSNorm of each q/k head before RoPE (Qwen3), tied embeddings, an explicit head_dim. Module
names mirror HF's, except that q/k/v and gate/up are fused (`load_weights` maps them).

Tensor parallelism (`tp`, distributed/): attention heads and the MLP's intermediate columns are
split across ranks (qkv_proj and gate_up_proj column-parallel, o_proj and down_proj row-parallel
with an all-reduce), the embedding and LM head by vocabulary; each rank's KV cache holds its KV
heads. Norms, RoPE and the residual stream are replicated.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig

from tritonllm.distributed.parallel_state import SINGLE, TensorParallel
from tritonllm.distributed.shard import RankSlice, TensorDims, narrow_to_rank
from tritonllm.layers.activation import SiluAndMul
from tritonllm.layers.attention import Attention, AttentionMetadata, Rope
from tritonllm.layers.embedding import LMHead, VocabEmbedding
from tritonllm.layers.linear import Linear, MergedLinear, NormedInput, QKVLinear, RowParallelLinear
from tritonllm.layers.norm import RMSNorm
from tritonllm.layers.rotary import RotaryEmbedding, rope_max_position, rope_parameters
from tritonllm.loader.safetensors_loader import CheckpointSlice, materialize
from tritonllm.quantization.config import LayerQuant, QuantConfig
from tritonllm.quantization.methods import copy_weight

# (config, flags, dtype, quant, prefix "model.layers.{i}.mlp", tp) -> the layer's feed-forward block
MakeMLP = Callable[..., nn.Module]
KVCache = tuple[torch.Tensor, torch.Tensor]  # (k_cache, v_cache), each [num_blocks, block_size, num_kv_heads, head_dim]

# a checkpoint's per-layer FP8 KV-cache scales: compressed-tensors puts them on self_attn, ModelOpt
# on k_proj / v_proj, vLLM exports on self_attn.attn
_KV_SCALE = re.compile(r"(model\.layers\.\d+\.self_attn)\.(?:k_proj\.|v_proj\.|attn\.)?([kv]_scale)")

# HF tensor name part -> (our fused module name part, shard id)
_FUSED_SHARDS: dict[str, tuple[str, str]] = {
    ".q_proj.": (".qkv_proj.", "q"),
    ".k_proj.": (".qkv_proj.", "k"),
    ".v_proj.": (".qkv_proj.", "v"),
    ".gate_proj.": (".gate_up_proj.", "gate"),
    ".up_proj.": (".gate_up_proj.", "up"),
}


@dataclass(frozen=True)
class LlamaFamilyFlags:
    qkv_bias: bool
    o_proj_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    attention_sinks: bool = False  # gpt-oss: one learned sink logit per head

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> LlamaFamilyFlags:
        attention_bias = bool(getattr(config, "attention_bias", False))
        # HF's Qwen2 hard-codes biases on q/k/v and none on o_proj, whatever the config says
        is_qwen2 = config.model_type in ("qwen2", "qwen2_moe")
        return cls(
            qkv_bias=is_qwen2 or attention_bias,
            o_proj_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            qk_norm=config.model_type in ("qwen3", "qwen3_moe"),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            attention_sinks=config.model_type == "gpt_oss",
        )


def check_supported(config: PretrainedConfig) -> None:
    """Refuse configs whose computation this model would not reproduce."""
    name = (config.architectures or [config.model_type])[0]
    if config.hidden_act != "silu":
        raise ValueError(f"{name}: hidden_act {config.hidden_act!r} is not supported (only 'silu')")


def layer_sliding_window(config: PretrainedConfig, layer: int) -> int | None:
    """The sliding window of decoder layer `layer` (None: full attention), as HF applies it:
    `layer_types` ("sliding_attention" / "full_attention", transformers 5) when the config lists
    them, else Qwen2/Qwen3's layers from `max_window_layers` on, else (Mistral) every layer;
    `use_sliding_window` false turns it off. A window at least max_position_embeddings long never
    drops a token, so it is left off (the kernels need not support it)."""
    window = getattr(config, "sliding_window", None)
    if window is None or not getattr(config, "use_sliding_window", True):
        return None
    if window >= config.max_position_embeddings:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return window if layer_types[layer] == "sliding_attention" else None
    first_windowed = getattr(config, "max_window_layers", 0)
    return window if layer >= first_windowed else None


def layer_quant(quant: QuantConfig | None, prefix: str, shards: tuple[str, ...] = ("",)) -> LayerQuant | None:
    """The quantization of the linear layer whose HF modules are prefix + each shard name (a fused
    layer's shards must agree: one layer runs one kernel)."""
    if quant is None:
        return None
    choices = {quant.for_layer(prefix + shard) for shard in shards}
    if len(choices) > 1:
        raise ValueError(
            f"{prefix}{{{','.join(shards)}}} are quantized differently; tritonllm fuses them into one layer"
        )
    return choices.pop()


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        flags: LlamaFamilyFlags,
        rotary: RotaryEmbedding,
        dtype: torch.dtype,
        quant: QuantConfig | None,
        prefix: str,
        sliding_window: int | None = None,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        # this rank's heads
        first_head, self.num_heads = tp.share(config.num_attention_heads, "num_attention_heads")
        self.rank_heads = RankSlice(first_head, self.num_heads, config.num_attention_heads)
        self.num_kv_heads = tp.kv_head_share(config.num_key_value_heads)[1]
        self.head_dim = model_head_dim(config)
        self.qkv_proj = QKVLinear(
            config.hidden_size, self.head_dim, config.num_attention_heads, config.num_key_value_heads,
            flags.qkv_bias, dtype, layer_quant(quant, f"{prefix}.", ("q_proj", "k_proj", "v_proj")), tp,
        )  # fmt: skip
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_dim, config.hidden_size, flags.o_proj_bias, dtype,
            layer_quant(quant, f"{prefix}.o_proj"), tp,
        )  # fmt: skip
        self.qk_norm = flags.qk_norm
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype)
        self.rotary_emb = rotary
        self.attn = Attention(
            self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5, sliding_window=sliding_window,
            sinks=flags.attention_sinks,
        )  # fmt: skip
        self.sinks = self.attn.sinks  # HF's name for them: self_attn.sinks
        self.attn.quantize_for(self.o_proj)  # a W8A8 o_proj: the attention kernels quantize its input

    def load_param(self, name: str, loaded: torch.Tensor | CheckpointSlice, shard_id: str | None = None) -> None:
        """The checkpoint's per-head sinks [num_attention_heads]: this rank's heads' (the only tensor
        of the block outside its layers)."""
        part = narrow_to_rank(loaded, name, TensorDims(0, None), self.rank_heads, None)
        copy_weight(self.sinks.data, part, name)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor | NormedInput, kv_cache: KVCache, meta: AttentionMetadata,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor | None:  # fmt: skip
        """o_proj's output; or, given the residual stream, None where o_proj added its output into it."""
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        # RoPE is applied by the attention layer, with the KV-cache write (one kernel: rope_kv_write); Qwen3
        # normalises every head's q and k over head_dim before it, in the same kernel
        qk_norm = (self.q_norm, self.k_norm) if self.qk_norm else None
        out = self.attn(q, k, v, kv_cache, meta, Rope(positions, self.rotary_emb, qk_norm))
        if residual is not None and self.o_proj.forward_residual(out, residual):
            return None
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        flags: LlamaFamilyFlags,
        dtype: torch.dtype,
        quant: QuantConfig | None,
        prefix: str,
        tp: TensorParallel = SINGLE,
        intermediate_size: int | None = None,
    ) -> None:
        super().__init__()
        size = intermediate_size or config.intermediate_size
        self.gate_up_proj = MergedLinear(
            config.hidden_size, {"gate": size, "up": size}, flags.mlp_bias, dtype,
            layer_quant(quant, f"{prefix}.", ("gate_proj", "up_proj")), tp,
        )  # fmt: skip
        self.down_proj = RowParallelLinear(
            size, config.hidden_size, flags.mlp_bias, dtype, layer_quant(quant, f"{prefix}.down_proj"), tp
        )
        self.act_fn = SiluAndMul()
        self.act_fn.quantize_for(self.down_proj)  # W8A8: the activation kernel quantizes for the GEMM

    def forward(self, x: torch.Tensor | NormedInput, residual: torch.Tensor | None = None) -> torch.Tensor | None:
        """The block's output; or, given the residual stream, None where down_proj added it into the stream."""
        return self.act_fn.mlp(self.gate_up_proj, self.down_proj, x, residual)


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        flags: LlamaFamilyFlags,
        rotary: RotaryEmbedding,
        dtype: torch.dtype,
        quant: QuantConfig | None,
        prefix: str,
        sliding_window: int | None = None,
        make_mlp: MakeMLP | None = None,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        make_mlp = make_mlp or LlamaMLP
        self.self_attn = LlamaAttention(config, flags, rotary, dtype, quant, f"{prefix}.self_attn", sliding_window, tp)
        self.mlp = make_mlp(config, flags, dtype, quant, f"{prefix}.mlp", tp)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        # W8A8 layers after the norms: the norm kernels quantize their outputs for the GEMMs
        self.input_layernorm.quantize_for(self.self_attn.qkv_proj)
        self.dense_mlp = isinstance(self.mlp, LlamaMLP)
        if self.dense_mlp:  # a MoE block's router reads the norm's output unquantized
            self.post_attention_layernorm.quantize_for(self.mlp.gate_up_proj)
        # the norms in the next GEMMs and the residual adds in o_proj's / down_proj's epilogues where the linear
        # implementation has such kernels (EngineConfig.fuse_norm_into_gemm); False: a norm kernel does both
        self.fuse_norm = False

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor | None,
        residual: torch.Tensor | None,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Pre-norm block; the residual add is fused into the next norm, so the sum travels separately.
        hidden None: the last layer added its output into residual already (fuse_norm), which this one may do
        too; the first layer's residual is None (hidden, the embeddings, starts the stream)."""
        if residual is None:
            residual, hidden = hidden, None
        fuse = self.fuse_norm
        x, residual = self.input_layernorm.deferred(hidden, residual, fuse)
        hidden = self.self_attn(positions, x, kv_cache, meta, residual if fuse else None)
        if not self.dense_mlp:  # a MoE block may run the norm in its router's launch (fuse_norm_into_router)
            return self.mlp.forward_normed(hidden, residual, self.post_attention_layernorm)
        x, residual = self.post_attention_layernorm.deferred(hidden, residual, fuse)
        return self.mlp(x, residual if fuse else None), residual


class LlamaModel(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        flags: LlamaFamilyFlags,
        dtype: torch.dtype,
        quant: QuantConfig | None,
        make_mlp: MakeMLP | None = None,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, dtype, tp)
        head_dim = model_head_dim(config)
        params = rope_parameters(config)
        rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        rotary = RotaryEmbedding(head_dim, rotary_dim, rope_max_position(params), params)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(
                config, flags, rotary, dtype, quant, f"model.layers.{i}", layer_sliding_window(config, i), make_mlp, tp
            )
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, residual, kv_cache, meta)
        return self.norm.deferred(hidden, residual, defer=False)[0]


def model_head_dim(config: PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class LlamaForCausalLM(nn.Module):
    """Serves LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM checkpoints.

    Parameters are allocated once, uninitialised, in `dtype` on `device` (quantized linear layers
    per `quant`, quantization/config.py); `load_weights` fills them. With tensor parallelism (`tp`)
    the model is this rank's shard of it.
    """

    def __init__(
        self,
        config: PretrainedConfig,
        dtype: torch.dtype,
        device: torch.device | str,
        quant: QuantConfig | None = None,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        check_supported(config)
        self.config = config
        self.flags = LlamaFamilyFlags.from_config(config)
        self.num_layers: int = config.num_hidden_layers
        self.num_kv_heads: int = tp.kv_head_share(config.num_key_value_heads)[1]  # this rank's KV cache
        self.head_dim: int = model_head_dim(config)
        self.vocab_size: int = config.vocab_size
        # layers create their parameters with torch.empty: the device context puts them in place
        with torch.device(device):
            self.model = LlamaModel(config, self.flags, dtype, quant, self.mlp_factory(), tp)
            tied = self.model.embed_tokens if self.flags.tie_word_embeddings else None
            self.lm_head = LMHead(config.vocab_size, config.hidden_size, dtype, tied_to=tied, tp=tp)

    def mlp_factory(self) -> MakeMLP | None:
        """What builds each decoder layer's feed-forward block (None: LlamaMLP); MoE models override it."""
        return None

    def load_special(self, name: str, tensor: torch.Tensor) -> bool:
        """Load a checkpoint tensor the generic name mapping does not place (MoE experts); False: not one."""
        return False

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """input_ids, positions [num_tokens] int64 -> final hidden states [num_tokens, hidden]."""
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, hidden] -> logits [n, vocab], in the model's dtype."""
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor | CheckpointSlice]]) -> None:
        """Copy HF-named checkpoint tensors into our parameters (fusing q/k/v and gate/up). Split
        layers read their rank's part of a tensor given as a CheckpointSlice; the others all of it.

        Raises ValueError naming every missing and every unexpected tensor, after reading them all.
        """
        params = dict(self.named_parameters())
        expected = self._expected_checkpoint_names(params)
        loaded: set[str] = set()
        unexpected: list[str] = []
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:  # a buffer some checkpoints carry; we build our own
                continue
            if name == "lm_head.weight" and self.flags.tie_word_embeddings:  # same tensor as the embedding
                continue
            kv_scale = _KV_SCALE.fullmatch(name)
            if kv_scale is not None:
                scale = float(materialize(tensor))
                self.get_submodule(f"{kv_scale.group(1)}.attn").checkpoint_kv_scales[kv_scale.group(2)] = scale
                continue
            target, shard_id = _our_name(name)
            module_name, _, leaf = target.rpartition(".")
            module = _submodule(self, module_name)
            try:
                if isinstance(module, (Linear, VocabEmbedding, LMHead)) or (
                    isinstance(module, LlamaAttention) and leaf == "sinks" and module.sinks is not None
                ):
                    # weights, biases, scales and sinks: the layer (and its method) places its part of them
                    module.load_param(leaf, tensor, shard_id)
                elif self.load_special(name, materialize(tensor)):
                    pass
                elif target in params and shard_id is None:
                    copy_weight(params[target], materialize(tensor), name)
                else:
                    unexpected.append(name)
                    continue
            except (ValueError, AttributeError) as error:
                raise ValueError(f"{name}: {error}") from error
            loaded.add(name)
        missing = sorted(expected - loaded)
        if missing or unexpected:
            raise ValueError(
                f"checkpoint does not match {type(self).__name__} ({self.config.model_type}): "
                f"missing tensors {missing}; unexpected tensors {sorted(unexpected)}"
            )
        for module in self.modules():
            if isinstance(module, Linear):
                module.finish_loading()

    def _expected_checkpoint_names(self, params: dict[str, nn.Parameter]) -> set[str]:
        """Every HF tensor name the checkpoint must hold: each fused param stands for its shards."""
        expected: set[str] = set()
        for name in params:
            shards = [name.replace(ours, hf) for hf, (ours, _) in _FUSED_SHARDS.items() if ours in name]
            expected.update(shards or [name])
        return expected


def _submodule(model: nn.Module, name: str) -> nn.Module | None:
    try:
        return model.get_submodule(name) if name else None
    except AttributeError:
        return None


def fused_module_name(hf_name: str) -> str:
    """The module of ours that holds HF tensor `hf_name` (q/k/v share one, gate/up another)."""
    return _our_name(hf_name)[0].rpartition(".")[0]


def _our_name(hf_name: str) -> tuple[str, str | None]:
    """HF tensor name -> (our parameter name, shard id within a fused parameter or None)."""
    for hf_part, (our_part, shard_id) in _FUSED_SHARDS.items():
        if hf_part in hf_name:
            return hf_name.replace(hf_part, our_part), shard_id
    return hf_name, None
