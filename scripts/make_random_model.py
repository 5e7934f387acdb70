"""Write a random-weight HF folder of a real architecture (GPU.md's benchmark shapes).

The tensors (names, shapes, layouts and values: tritonllm/loader/random_weights.py) are planned
first, then each safetensors shard (4 GiB) is made, written and freed in turn: a 60 GB model never
sits in memory. config.json is the published one (with `--layers N`, the first N layers only); the
tokenizer is a fast byte-level BPE whose vocabulary covers the model's
(models/covering_tokenizer.py), BOS and EOS at the config's ids, so sampled ids decode to text and
detokenization costs what it costs with a real model. With `--config-only` no weights are written:
the engine makes them on the device with `model.load_format=dummy` (no disk, no read: the way to
run a model larger than the disk).

    python scripts/make_random_model.py llama3-8b /tmp/models/llama3-8b
    python scripts/make_random_model.py gpt-oss-20b /tmp/models/gpt-oss-20b-2l --layers 2
    python scripts/make_random_model.py qwen3-30b-a3b /tmp/models/qwen3-30b-a3b --config-only
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tritonllm.loader.random_weights import TensorSpec, make_tensor, tensor_specs
from tritonllm.models.covering_tokenizer import make_covering_tokenizer

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
    name: str,
    out: Path,
    shard_bytes: int = 4 << 30,
    seed: int = 0,
    layers: int | None = None,
    config_only: bool = False,
    **overrides: Any,
) -> Path:
    """Write the folder for SHAPES[name] (first `layers` layers; `overrides` replace config values,
    e.g. to shrink a model for a test) to `out`; with `config_only`, its config and tokenizer only
    (for model.load_format=dummy)."""
    shape = shrunk_shape(name, layers, **overrides)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    shards = [] if config_only else plan_shards(tensor_specs(shape), shard_bytes)
    weight_map = {}
    for i, shard in enumerate(shards):  # one shard in memory at a time
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {spec.name: make_tensor(spec, gen, device).cpu() for spec in shard}
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, fname))
        del tensors
    total = sum(spec.nbytes for shard in shards for spec in shard)
    if shards:
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
    parser.add_argument(
        "--config-only", action="store_true", help="config and tokenizer, no weights (run with model.load_format=dummy)"
    )
    args = parser.parse_args()
    print(make_random_model(args.name, args.out, layers=args.layers, config_only=args.config_only))


if __name__ == "__main__":
    main()
