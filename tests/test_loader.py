"""Loading local HF folders: configs, EOS ids, (sharded) safetensors, weight-name checks, tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_file

from tritonllm.loader.hf_config import load_eos_token_ids, load_hf_config
from tritonllm.loader.safetensors_loader import iterate_safetensors
from tritonllm.loader.tokenizer import encode_chat, load_tokenizer, render_chat
from tritonllm.models.llama import LlamaForCausalLM
from tritonllm.models.loader import layer_features, load_model
from tritonllm.models.registry import MODEL_REGISTRY, get_model_class
from tritonllm.models.tiny import tiny_model_path


def _copy_without_weights(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("config.json", "generation_config.json"):
        shutil.copy(src / name, dst / name)
    return dst


def _write_shards(tensors: dict[str, torch.Tensor], folder: Path, num_shards: int) -> list[str]:
    names = sorted(tensors)
    shard_files = [f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors" for i in range(num_shards)]
    weight_map = {}
    for i, file in enumerate(shard_files):
        shard = {name: tensors[name].contiguous() for name in names[i::num_shards]}
        save_file(shard, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return shard_files


def test_sharded_checkpoint_loads_the_same_tensors_and_model_as_single_file(tmp_path: Path) -> None:
    single = tiny_model_path("Qwen2ForCausalLM")
    tensors = dict(iterate_safetensors(single))
    sharded = _copy_without_weights(single, tmp_path / "sharded")
    _write_shards(tensors, sharded, num_shards=3)

    sharded_tensors = dict(iterate_safetensors(sharded))
    assert sharded_tensors.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert torch.equal(sharded_tensors[name], tensor), name

    model, _ = load_model(sharded, torch.float32, "cpu")
    q_bias = tensors["model.layers.1.self_attn.q_proj.bias"]
    assert torch.equal(model.model.layers[1].self_attn.qkv_proj.bias[: q_bias.numel()], q_bias)


def test_index_naming_an_absent_shard_fails_with_its_name(tmp_path: Path) -> None:
    single = tiny_model_path("LlamaForCausalLM")
    folder = _copy_without_weights(single, tmp_path / "broken")
    shard_files = _write_shards(dict(iterate_safetensors(single)), folder, num_shards=2)
    (folder / shard_files[1]).unlink()
    with pytest.raises(FileNotFoundError, match=shard_files[1]):
        list(iterate_safetensors(folder))


def test_missing_and_unexpected_tensors_are_all_named() -> None:
    path = tiny_model_path("LlamaForCausalLM")
    config = load_hf_config(path)
    dropped = {"model.layers.1.self_attn.k_proj.weight", "model.layers.0.mlp.up_proj.weight", "lm_head.weight"}
    weights = [(n, t) for n, t in iterate_safetensors(path) if n not in dropped]
    weights += [("model.layers.7.self_attn.q_proj.weight", torch.ones(2, 2)), ("extra.scale", torch.ones(1))]
    model = LlamaForCausalLM(config, torch.float32, "cpu")
    with pytest.raises(ValueError) as error:
        model.load_weights(weights)
    for name in [*dropped, "model.layers.7.self_attn.q_proj.weight", "extra.scale"]:
        assert name in str(error.value)


@pytest.mark.parametrize("bad_name", ["model.norm.weight", "model.layers.0.self_attn.v_proj.weight"])
def test_tensor_of_the_wrong_shape_is_named(bad_name: str) -> None:
    path = tiny_model_path("LlamaForCausalLM")
    weights = [(n, t[:-1] if n == bad_name else t) for n, t in iterate_safetensors(path)]
    model = LlamaForCausalLM(load_hf_config(path), torch.float32, "cpu")
    with pytest.raises(ValueError, match=bad_name):
        model.load_weights(weights)


def test_tied_embeddings_need_no_lm_head_and_share_the_embedding() -> None:
    path = tiny_model_path("Qwen3ForCausalLM")
    assert "lm_head.weight" not in dict(iterate_safetensors(path))
    model, config = load_model(path, torch.float32, "cpu")
    assert config.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_weights_are_cast_to_the_requested_dtype() -> None:
    model, _ = load_model(tiny_model_path("MistralForCausalLM"), torch.float16, "cpu")
    assert {p.dtype for p in model.parameters()} == {torch.float16}
    assert model.model.layers[0].self_attn.rotary_emb.cos_sin_cache.dtype == torch.float32


def test_unknown_architecture_lists_the_supported_ones() -> None:
    config = transformers.GPT2Config(architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError, match="GPT2LMHeadModel") as error:
        get_model_class(config)
    for name in MODEL_REGISTRY:
        assert name in str(error.value)


def _windows(config: transformers.PretrainedConfig) -> list[int | None]:
    model = LlamaForCausalLM(config, torch.float32, "cpu")
    return [layer.self_attn.attn.sliding_window for layer in model.model.layers]


def test_sliding_windows_per_layer_follow_the_hf_config() -> None:
    """Mistral windows every layer; Qwen2/Qwen3 from max_window_layers on (via the layer_types
    transformers derives), or as explicit layer_types lists say; use_sliding_window false or a window
    as long as max_position_embeddings turns them off. The layers then require the feature."""
    small = dict(hidden_size=64, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, vocab_size=32)
    small |= dict(num_hidden_layers=3, max_position_embeddings=64)
    mistral = transformers.MistralConfig(architectures=["MistralForCausalLM"], sliding_window=16, **small)
    assert _windows(mistral) == [16, 16, 16]
    assert layer_features(LlamaForCausalLM(mistral, torch.float32, "cpu")) == {
        "attention": frozenset({"sliding_window"})
    }
    mistral.sliding_window = 64  # as long as any sequence: inactive
    assert _windows(mistral) == [None, None, None]
    qwen2 = dict(sliding_window=16, max_window_layers=1, **small)
    assert _windows(transformers.Qwen2Config(use_sliding_window=True, **qwen2)) == [None, 16, 16]
    assert _windows(transformers.Qwen2Config(use_sliding_window=False, **qwen2)) == [None, None, None]
    qwen3 = transformers.Qwen3Config(architectures=["Qwen3ForCausalLM"], use_sliding_window=True, **qwen2)
    qwen3.layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    assert _windows(qwen3) == [16, None, 16]


def test_unknown_rope_type_is_refused() -> None:
    config = transformers.LlamaConfig(
        architectures=["LlamaForCausalLM"],
        hidden_size=64,
        intermediate_size=64,
        num_attention_heads=2,
        num_hidden_layers=1,
        vocab_size=32,
        max_position_embeddings=64,
        rope_scaling={"rope_type": "proportional", "factor": 2.0},
    )
    with pytest.raises(ValueError, match="'proportional' is not supported"):
        LlamaForCausalLM(config, torch.float32, "cpu")


@pytest.mark.parametrize(
    ("generation_config", "expected"),
    [({"eos_token_id": [5, 7]}, [5, 7]), ({"eos_token_id": 9}, [9]), ({}, [2]), (None, [2])],
)
def test_eos_ids_come_from_generation_config_else_config(
    tmp_path: Path, generation_config: dict | None, expected: list[int]
) -> None:
    if generation_config is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation_config))
    config = transformers.LlamaConfig(eos_token_id=2)
    assert load_eos_token_ids(tmp_path, config) == expected


def test_folder_without_config_or_weights_names_the_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf_config(tmp_path)
    shutil.copy(tiny_model_path("LlamaForCausalLM") / "config.json", tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors or model\.safetensors\.index\.json"):
        load_hf_config(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_hf_config("some-org/some-hub-model")


def test_chat_template_renders_roles_and_generation_prompt() -> None:
    tokenizer = load_tokenizer(tiny_model_path("LlamaForCausalLM"))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The model reads."}]
    text = render_chat(tokenizer, messages)
    assert text == "<|bos|><|system|>Be brief.<|eos|><|user|>The model reads.<|eos|><|assistant|>"
    assert render_chat(tokenizer, messages, add_generation_prompt=False).endswith("<|eos|>")
    ids = encode_chat(tokenizer, messages)
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids) == text
