"""Random weights with the tensor names, shapes and layouts of real checkpoints, made on the device.

Two users: `scripts/make_random_model.py` writes them as a safetensors folder, and
`model.load_format=dummy` (vLLM's `--load-format dummy`) feeds them straight into the model's
weight loaders, so a benchmark of a 60 GB architecture needs only its config.json and tokenizer
(no disk, no read) and still runs every loading path (stacking experts, MXFP4 blocks as published,
online quantization).

Dense models take their tensor names and shapes from transformers' own class (built on the meta
device, so no memory is spent). MoE models take the tensor names of their published checkpoints,
which transformers 5 renames on load (it stacks experts): Qwen3-MoE's
`mlp.experts.{e}.{gate,up,down}_proj.weight` + `mlp.gate.weight`, Mixtral's
`block_sparse_moe.experts.{e}.w1/w2/w3.weight` + `block_sparse_moe.gate.weight`, and gpt-oss's
MXFP4 experts (`mlp.experts.{gate_up,down}_proj_{blocks,scales,bias}`, quantization/mxfp4.py's
layout) with attention sinks, biases and a router with bias.

Values: random normal * 0.02 (norms one), in bfloat16. MXFP4 blocks are random bytes (every e2m1
code equally likely: rms 2.9) under e8m0 scales 2^-8..2^-6, so the dequantized experts have rms
~0.02 like the bf16 weights and activations stay as bounded as in the dense models. Router weights
are random, so tokens spread over the experts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

WEIGHT_STD = 0.02
E8M0_BIAS = 127
MXFP4_SCALE_EXPONENTS = (-8, -6)  # e8m0 scales 2^-8 .. 2^-6 (see the module docstring)
MX_BLOCK = 32  # e2m1 values per scale; 16 bytes


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    kind: str  # "normal" (bf16 N(0, 0.02)), "ones" (bf16), "fp4" (uint8 e2m1 pairs), "e8m0" (uint8 scales)

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * (1 if self.kind in ("fp4", "e8m0") else 2)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _dense_specs(shape: dict[str, Any]) -> Iterator[TensorSpec]:
    """Names and shapes of transformers' own class on the meta device."""
    fields = {k: v for k, v in shape.items() if k != "model_type"}
    config = AutoConfig.for_model(shape["model_type"], **fields)
    with torch.device("meta"):
        meta_model = AutoModelForCausalLM.from_config(config)
    for pname, p in meta_model.state_dict().items():
        if config.tie_word_embeddings and pname == "lm_head.weight":
            continue
        yield TensorSpec(pname, tuple(p.shape), "ones" if pname.endswith("norm.weight") else "normal")


def _attention_specs(prefix: str, s: dict[str, Any], bias: bool, qk_norm: bool) -> Iterator[TensorSpec]:
    hidden, head_dim = s["hidden_size"], s.get("head_dim") or s["hidden_size"] // s["num_attention_heads"]
    q, kv = s["num_attention_heads"] * head_dim, s["num_key_value_heads"] * head_dim
    for proj, (rows, cols) in {
        "q_proj": (q, hidden),
        "k_proj": (kv, hidden),
        "v_proj": (kv, hidden),
        "o_proj": (hidden, q),
    }.items():
        yield TensorSpec(f"{prefix}.self_attn.{proj}.weight", (rows, cols), "normal")
        if bias:
            yield TensorSpec(f"{prefix}.self_attn.{proj}.bias", (rows,), "normal")
    if qk_norm:
        yield TensorSpec(f"{prefix}.self_attn.q_norm.weight", (head_dim,), "ones")
        yield TensorSpec(f"{prefix}.self_attn.k_norm.weight", (head_dim,), "ones")


def _moe_specs(shape: dict[str, Any]) -> Iterator[TensorSpec]:
    """The published checkpoints' names, layer by layer (so shards follow layers)."""
    s, model_type = shape, shape["model_type"]
    hidden, vocab = s["hidden_size"], s["vocab_size"]
    yield TensorSpec("model.embed_tokens.weight", (vocab, hidden), "normal")
    for i in range(s["num_hidden_layers"]):
        p = f"model.layers.{i}"
        yield TensorSpec(f"{p}.input_layernorm.weight", (hidden,), "ones")
        if model_type == "qwen3_moe":
            yield from _attention_specs(p, s, s["attention_bias"], qk_norm=True)
            inter, experts = s["moe_intermediate_size"], s["num_experts"]
            yield TensorSpec(f"{p}.mlp.gate.weight", (experts, hidden), "normal")
            for e in range(experts):
                for proj, dims in (
                    ("gate_proj", (inter, hidden)),
                    ("up_proj", (inter, hidden)),
                    ("down_proj", (hidden, inter)),
                ):
                    yield TensorSpec(f"{p}.mlp.experts.{e}.{proj}.weight", dims, "normal")
        elif model_type == "mixtral":
            yield from _attention_specs(p, s, False, qk_norm=False)
            inter, experts = s["intermediate_size"], s["num_local_experts"]
            yield TensorSpec(f"{p}.block_sparse_moe.gate.weight", (experts, hidden), "normal")
            for e in range(experts):
                for w, dims in (("w1", (inter, hidden)), ("w2", (hidden, inter)), ("w3", (inter, hidden))):
                    yield TensorSpec(f"{p}.block_sparse_moe.experts.{e}.{w}.weight", dims, "normal")
        elif model_type == "gpt_oss":
            yield from _attention_specs(p, s, True, qk_norm=False)
            yield TensorSpec(f"{p}.self_attn.sinks", (s["num_attention_heads"],), "normal")
            inter, experts = s["intermediate_size"], s["num_local_experts"]
            yield TensorSpec(f"{p}.mlp.router.weight", (experts, hidden), "normal")
            yield TensorSpec(f"{p}.mlp.router.bias", (experts,), "normal")
            # MXFP4 as published: [E, out, in / 32, 16] blocks and [E, out, in / 32] e8m0 scales; gate_up's
            # 2I output rows interleave gate and up (g0 u0 g1 u1 ...), as do its bias's
            for proj, (rows, cols) in (("gate_up_proj", (2 * inter, hidden)), ("down_proj", (hidden, inter))):
                if cols % MX_BLOCK:
                    raise ValueError(f"{p}.mlp.experts.{proj}: {cols} inputs is not a multiple of {MX_BLOCK}")
                yield TensorSpec(
                    f"{p}.mlp.experts.{proj}_blocks", (experts, rows, cols // MX_BLOCK, MX_BLOCK // 2), "fp4"
                )
                yield TensorSpec(f"{p}.mlp.experts.{proj}_scales", (experts, rows, cols // MX_BLOCK), "e8m0")
                yield TensorSpec(f"{p}.mlp.experts.{proj}_bias", (experts, rows), "normal")
        else:
            raise ValueError(f"no MoE tensor layout for model_type {model_type!r}")
        yield TensorSpec(f"{p}.post_attention_layernorm.weight", (hidden,), "ones")
    yield TensorSpec("model.norm.weight", (hidden,), "ones")
    if not s.get("tie_word_embeddings", False):
        yield TensorSpec("lm_head.weight", (vocab, hidden), "normal")


MOE_MODEL_TYPES = ("qwen3_moe", "mixtral", "gpt_oss")


def tensor_specs(shape: dict[str, Any]) -> list[TensorSpec]:
    """Every tensor of the checkpoint for this config, in write order."""
    if shape["model_type"] in MOE_MODEL_TYPES:
        return list(_moe_specs(shape))
    return list(_dense_specs(shape))


def make_tensor(spec: TensorSpec, gen: torch.Generator, device: str) -> torch.Tensor:
    if spec.kind == "ones":
        return torch.ones(spec.shape, dtype=torch.bfloat16, device=device)
    if spec.kind == "fp4":
        return torch.randint(0, 256, spec.shape, generator=gen, device=device, dtype=torch.uint8)
    if spec.kind == "e8m0":
        low, high = (E8M0_BIAS + e for e in MXFP4_SCALE_EXPONENTS)
        return torch.randint(low, high + 1, spec.shape, generator=gen, device=device, dtype=torch.uint8)
    return (torch.randn(spec.shape, generator=gen, device=device, dtype=torch.float32) * WEIGHT_STD).to(torch.bfloat16)


def config_shape(config: PretrainedConfig) -> dict[str, Any]:
    """An HF config as the plain mapping tensor_specs reads: model_type included, and the published
    names of fields transformers renames (its attribute_map: Qwen3-MoE's num_experts)."""
    aliases = {alias: getattr(config, alias) for alias in config.attribute_map}
    return {**config.to_dict(), **aliases, "model_type": config.model_type}


def random_weights(
    config: PretrainedConfig, device: torch.device | str, seed: int = 0
) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, random tensor on `device`) for every tensor of the architecture's checkpoint,
    one at a time, in the form its published safetensors hold them."""
    gen = torch.Generator(device=device).manual_seed(seed)
    for spec in tensor_specs(config_shape(config)):
        yield spec.name, make_tensor(spec, gen, device)
