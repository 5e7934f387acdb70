"""scripts/make_random_model.py on heavily shrunk configs: HF reads the config, the tensors carry
the published checkpoints' names, shapes and dtypes (transformers loads the MoE ones without a
missing or unexpected key), MXFP4 scales stay in range, and shards split the model."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_random_model.py"
_spec = importlib.util.spec_from_file_location("make_random_model", _SCRIPT)
maker = importlib.util.module_from_spec(_spec)
sys.modules["make_random_model"] = maker
_spec.loader.exec_module(maker)

# tiny sizes, the published structure (vocab holds the 256 byte symbols and BOS/EOS)
_SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=320, bos_token_id=300)
SHRUNK = {
    "qwen3-30b-a3b": dict(_SMALL, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          intermediate_size=64, eos_token_id=301),
    "mixtral-8x7b": dict(_SMALL, intermediate_size=32, num_local_experts=4, eos_token_id=301),
    "gpt-oss-20b": dict(_SMALL, head_dim=16, intermediate_size=64, num_local_experts=4, eos_token_id=301,
                        pad_token_id=302),
    "llama3-8b": dict(_SMALL, head_dim=16, intermediate_size=64, eos_token_id=301),
}  # fmt: skip


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    out = {}
    for fname in sorted(set(index["weight_map"].values())):
        with safe_open(folder / fname, "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118 (safe_open has no __iter__)
    assert set(out) == set(index["weight_map"])
    return out


@pytest.mark.parametrize("name", list(SHRUNK))
def test_shrunk_model_folder_reads_as_published(name: str, tmp_path: Path) -> None:
    folder = maker.make_random_model(name, tmp_path, shard_bytes=64 << 10, layers=2, **SHRUNK[name])
    config = transformers.AutoConfig.from_pretrained(folder)
    published = maker.SHAPES[name]
    assert config.architectures == published["architectures"]
    assert config.num_hidden_layers == 2
    tensors = _tensors(folder)
    assert len(set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values())) > 1
    for tensor in tensors.values():
        assert torch.isfinite(tensor.float()).all()
    assert transformers.AutoTokenizer.from_pretrained(folder).eos_token_id == 301

    if name == "qwen3-30b-a3b":
        assert config.num_experts == 4 and config.norm_topk_prob and config.moe_intermediate_size == 32
        assert tensors["model.layers.1.mlp.experts.3.down_proj.weight"].shape == (64, 32)
        assert tensors["model.layers.0.mlp.gate.weight"].shape == (4, 64)
        assert "model.layers.0.self_attn.q_norm.weight" in tensors
    if name == "mixtral-8x7b":
        assert tensors["model.layers.1.block_sparse_moe.experts.3.w2.weight"].shape == (64, 32)
        assert tensors["model.layers.0.block_sparse_moe.gate.weight"].shape == (4, 64)
    if name == "gpt-oss-20b":
        assert config.layer_types == ["sliding_attention", "full_attention"]
        assert config.quantization_config["quant_method"] == "mxfp4"
        assert config.rope_parameters["rope_type"] == "yarn" and config.rope_parameters["truncate"] is False
        p = "model.layers.1"
        assert tensors[f"{p}.self_attn.sinks"].shape == (4,)
        assert tensors[f"{p}.self_attn.q_proj.bias"].shape == (64,)
        assert tensors[f"{p}.mlp.router.bias"].shape == (4,)
        blocks, scales = (
            tensors[f"{p}.mlp.experts.gate_up_proj_blocks"],
            tensors[f"{p}.mlp.experts.gate_up_proj_scales"],
        )
        assert blocks.dtype == scales.dtype == torch.uint8
        assert blocks.shape == (4, 128, 2, 16) and scales.shape == (4, 128, 2)
        assert tensors[f"{p}.mlp.experts.gate_up_proj_bias"].shape == (4, 128)
        assert tensors[f"{p}.mlp.experts.down_proj_blocks"].shape == (4, 64, 2, 16)
        assert tensors[f"{p}.mlp.experts.down_proj_bias"].dtype == torch.bfloat16
        assert 127 - 8 <= int(scales.min()) and int(scales.max()) <= 127 - 6
        assert len(blocks.unique()) > 200  # random bytes: every e2m1 code pair occurs
    else:
        assert all(t.dtype == torch.bfloat16 for t in tensors.values())

    if name != "gpt-oss-20b":  # transformers maps the published names onto its modules (MXFP4 needs a GPU)
        _, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_layers_option_keeps_the_published_config_otherwise() -> None:
    shape = maker.shrunk_shape("gpt-oss-20b", layers=3)
    assert shape["num_hidden_layers"] == 3
    assert shape["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    assert shape["num_local_experts"] == 32 and shape["vocab_size"] == 201088
    full = maker.tensor_specs(maker.shrunk_shape("qwen3-30b-a3b"))
    assert sum(spec.nbytes for spec in full) / 1e9 == pytest.approx(61.1, abs=0.5)  # the 30.5B parameters in bf16


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "gpt-oss-20b", "llama3-8b"])
def test_config_only_folder_runs_with_dummy_weights(name: str, tmp_path: Path) -> None:
    """--config-only writes no weights; load_format=dummy makes them on the device in the checkpoint's
    layout (the same names and shapes the written folder has) and the engine generates; without it the
    engine names the fix."""
    from tritonllm import LLM, SamplingParams
    from tritonllm.loader.hf_config import load_hf_config
    from tritonllm.loader.random_weights import random_weights

    folder = maker.make_random_model(name, tmp_path / "cfg", layers=2, config_only=True, **SHRUNK[name])
    assert not list(folder.glob("*.safetensors*"))
    written = maker.make_random_model(name, tmp_path / "full", layers=2, **SHRUNK[name])
    made = dict(random_weights(load_hf_config(folder, weights=False), "cpu"))
    assert {k: tuple(v.shape) for k, v in made.items()} == {k: tuple(v.shape) for k, v in _tensors(written).items()}
    with pytest.raises(FileNotFoundError, match="load_format=dummy"):
        LLM(model=str(folder), kernel_backend="torch_ref", max_model_len=64, num_gpu_blocks_override=16)
    llm = LLM(model=str(folder), load_format="dummy", kernel_backend="torch_ref", max_model_len=64,
              num_gpu_blocks_override=16)  # fmt: skip
    out = llm.generate(["hello"], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
