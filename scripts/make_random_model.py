"""Write a random-weight HF folder of a real architecture (GPU.md's benchmark shapes).

Tensor names and shapes come from transformers' own class (built on the meta device, so no
memory is spent); the values are random normal * 0.02, made on the GPU when there is one, in
bfloat16, and saved as safetensors shards with an index. The tokenizer is a fast byte-level BPE
whose vocabulary covers the model's (models/covering_tokenizer.py), BOS and EOS at the config's
ids, so sampled ids decode to text and detokenization costs what it costs with a real model.

    python scripts/make_random_model.py llama3-8b /tmp/models/llama3-8b
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

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
}


def make_random_model(name: str, out: Path, shard_bytes: int = 4 << 30, seed: int = 0) -> Path:
    shape = dict(SHAPES[name])
    model_type = shape.pop("model_type")
    config = AutoConfig.for_model(model_type, **shape)
    config.torch_dtype = "bfloat16"
    with torch.device("meta"):
        meta_model = AutoModelForCausalLM.from_config(config)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    weight_map = {}
    for pname, p in meta_model.state_dict().items():
        if config.tie_word_embeddings and pname == "lm_head.weight":
            continue
        if pname.endswith("norm.weight"):
            t = torch.ones(p.shape, dtype=torch.bfloat16, device=device)
        else:
            t = (torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32) * 0.02).to(torch.bfloat16)
        if size + t.numel() * 2 > shard_bytes and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][pname] = t
        size += t.numel() * 2
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: v.cpu().contiguous() for k, v in shard.items()}, str(out / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": shape["eos_token_id"]}))
    specials = {shape["bos_token_id"]: "<|bos|>", shape["eos_token_id"]: "<|eos|>"}
    make_covering_tokenizer(shape["vocab_size"], specials).save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    print(make_random_model(args.name, args.out))


if __name__ == "__main__":
    main()
