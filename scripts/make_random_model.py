"""Write a random-weight HF folder of a real architecture (GPU.md's benchmark shapes).

Dense models take their tensor names and shapes from transformers' own class (built on the meta
device, so no memory is spent). MoE models are written with the tensor names of their published
checkpoints, which transformers 5 renames on load (it stacks experts): Qwen3-MoE's
`mlp.experts.{e}.{gate,up,down}_proj.weight` + `mlp.gate.weight`, Mixtral's
`block_sparse_moe.experts.{e}.w1/w2/w3.weight` + `block_sparse_moe.gate.weight`, and gpt-oss's
MXFP4 experts (`mlp.experts.{gate_up,down}_proj_{blocks,scales,bias}`, quantization/mxfp4.py's
layout) with attention sinks, biases and a router with bias.

Values: random normal * 0.02 (norms one), in bfloat16, made on the GPU when there is one. MXFP4
blocks are random bytes (every e2m1 code equally likely: rms 2.9) under e8m0 scales 2^-8..2^-6,
so the dequantized experts have rms ~0.02 like the bf16 weights and activations stay as bounded
as in the dense models. Router weights are random, so tokens spread over the experts.

The tensors are planned first, then each safetensors shard (4 GiB) is made, written and freed in
turn: a 60 GB model never sits in memory. config.json is the published one (with `--layers N`,
the first N layers only); the tokenizer is a fast byte-level BPE whose vocabulary covers the
model's (models/covering_tokenizer.py), BOS and EOS at the config's ids, so sampled ids decode to
text and detokenization costs what it costs with a real model.

    python scripts/make_random_model.py llama3-8b /tmp/models/llama3-8b
    python scripts/make_random_model.py gpt-oss-20b /tmp/models/gpt-oss-20b-2l --layers 2
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

from tritonllm.models.covering_tokenizer import make_covering_tokenizer

WEIGHT_STD = 0.02
E8M0_BIAS = 127
MXFP4_SCALE_EXPONENTS = (-8, -6)  # e8m0 scales 2^-8 .. 2^-6 (see the module docstring)
MX_BLOCK = 32  # e2m1 values per scale; 16 bytes

SHAPES = {
    "llama3-8b": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        num_hidden_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        bos_token_id=128000,
        eos_token_id=128001,
    ),
    "qwen3-0.6b": dict(
        model_type="qwen3",
        architectures=["Qwen3ForCausalLM"],
        num_hidden_layers=28,
        hidden_size=1024,
        intermediate_size=3072,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        num_hidden_layers=28,
        hidden_size=3584,
        intermediate_size=18944,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=151643,
        eos_token_id=151645,
    ),
    # as published in Qwen/Qwen3-30B-A3B's config.json
    "qwen3-30b-a3b": dict(
        architectures=["Qwen3MoeForCausalLM"],
        attention_bias=False,
        attention_dropout=0.0,
        bos_token_id=151643,
        decoder_sparse_step=1,
        eos_token_id=151645,
        head_dim=128,
        hidden_act="silu",
        hidden_size=2048,
        initializer_range=0.02,
        intermediate_size=6144,
        max_position_embeddings=40960,
        max_window_layers=48,
        mlp_only_layers=[],
        model_type="qwen3_moe",
        moe_intermediate_size=768,
        norm_topk_prob=True,
        num_attention_heads=32,
        num_experts=128,
        num_experts_per_tok=8,
        num_hidden_layers=48,
        num_key_value_heads=4,
        output_router_logits=False,
        rms_norm_eps=1e-06,
        rope_scaling=None,
        rope_theta=1000000.0,
        router_aux_loss_coef=0.001,
        sliding_window=None,
        tie_word_embeddings=False,
        use_cache=True,
        use_sliding_window=False,
        vocab_size=151936,
    ),
    # as published in mistralai/Mixtral-8x7B-v0.1's config.json
    "mixtral-8x7b": dict(
        architectures=["MixtralForCausalLM"],
        attention_dropout=0.0,
        bos_token_id=1,
        eos_token_id=2,
        hidden_act="silu",
        hidden_size=4096,
        initializer_range=0.02,
        intermediate_size=14336,
        max_position_embeddings=32768,
        model_type="mixtral",
        num_attention_heads=32,
        num_experts_per_tok=2,
        num_hidden_layers=32,
        num_key_value_heads=8,
        num_local_experts=8,
        output_router_logits=False,
        rms_norm_eps=1e-05,
        rope_theta=1000000.0,
        router_aux_loss_coef=0.02,
        sliding_window=None,
        tie_word_embeddings=False,
        use_cache=True,
        vocab_size=32000,
    ),
    # as published in openai/gpt-oss-20b's config.json (bos: its <|startoftext|>)
    "gpt-oss-20b": dict(
        architectures=["GptOssForCausalLM"],
        attention_bias=True,
        attention_dropout=0.0,
        bos_token_id=199998,
        eos_token_id=200002,
        experts_per_token=4,
        head_dim=64,
        hidden_act="silu",
        hidden_size=2880,
        initial_context_length=4096,
        initializer_range=0.02,
        intermediate_size=2880,
        layer_types=["sliding_attention", "full_attention"] * 12,
        max_position_embeddings=131072,
        model_type="gpt_oss",
        num_attention_heads=64,
        num_experts_per_tok=4,
        num_hidden_layers=24,
        num_key_value_heads=8,
        num_local_experts=32,
        output_router_logits=False,
        pad_token_id=199999,
        quantization_config={
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
            "quant_method": "mxfp4",
        },
        rms_norm_eps=1e-05,
        rope_scaling={
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": False,
        },
        rope_theta=150000,
        router_aux_loss_coef=0.9,
        sliding_window=128,
        swiglu_limit=7.0,
        tie_word_embeddings=False,
        use_cache=True,
        vocab_size=201088,
    ),
}


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


def shrunk_shape(name: str, layers: int | None = None, **overrides: Any) -> dict[str, Any]:
    """SHAPES[name] with `overrides` applied and, with `layers`, only its first `layers` layers."""
    shape = {**SHAPES[name], **overrides}
    if layers is not None:
        shape["num_hidden_layers"] = layers
        for key in ("layer_types", "mlp_only_layers"):
            if shape.get(key):
                shape[key] = [v for v in shape[key] if not isinstance(v, int) or v < layers][:layers]
        if "max_window_layers" in shape:
            shape["max_window_layers"] = min(shape["max_window_layers"], layers)
    return shape


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


def _make(spec: TensorSpec, gen: torch.Generator, device: str) -> torch.Tensor:
    if spec.kind == "ones":
        return torch.ones(spec.shape, dtype=torch.bfloat16, device=device)
    if spec.kind == "fp4":
        return torch.randint(0, 256, spec.shape, generator=gen, device=device, dtype=torch.uint8)
    if spec.kind == "e8m0":
        low, high = (E8M0_BIAS + e for e in MXFP4_SCALE_EXPONENTS)
        return torch.randint(low, high + 1, spec.shape, generator=gen, device=device, dtype=torch.uint8)
    return (torch.randn(spec.shape, generator=gen, device=device, dtype=torch.float32) * WEIGHT_STD).to(torch.bfloat16)


def plan_shards(specs: list[TensorSpec], shard_bytes: int) -> list[list[TensorSpec]]:
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if size + spec.nbytes > shard_bytes and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    return shards


def make_random_model(
    name: str, out: Path, shard_bytes: int = 4 << 30, seed: int = 0, layers: int | None = None, **overrides: Any
) -> Path:
    """Write the folder for SHAPES[name] (first `layers` layers; `overrides` replace config values,
    e.g. to shrink a model for a test) to `out`."""
    shape = shrunk_shape(name, layers, **overrides)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    shards = plan_shards(tensor_specs(shape), shard_bytes)
    weight_map = {}
    for i, shard in enumerate(shards):  # one shard in memory at a time
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {spec.name: _make(spec, gen, device).cpu() for spec in shard}
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, fname))
        del tensors
    total = sum(spec.nbytes for shard in shards for spec in shard)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = {**shape, "torch_dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": shape["eos_token_id"]}))
    specials = {shape["bos_token_id"]: "<|bos|>", shape["eos_token_id"]: "<|eos|>"}
    make_covering_tokenizer(shape["vocab_size"], specials).save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=None, help="write only the first N decoder layers")
    args = parser.parse_args()
    print(make_random_model(args.name, args.out, layers=args.layers))


if __name__ == "__main__":
    main()
