"""The tiny-model maker: deterministic, fast, cached atomically."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tritonllm.loader.hf_config import load_eos_token_ids, load_hf_config
from tritonllm.loader.tokenizer import load_tokenizer
from tritonllm.models.tiny import TINY_MODEL_VERSION, make_tiny_model, tiny_model_path


def test_make_tiny_model_is_deterministic_for_a_seed_and_fast(tmp_path: Path) -> None:
    start = time.perf_counter()
    first = make_tiny_model(tmp_path / "a", "Qwen3ForCausalLM", seed=3)
    assert time.perf_counter() - start < 5.0
    second = make_tiny_model(tmp_path / "b", "Qwen3ForCausalLM", seed=3)
    other_seed = make_tiny_model(tmp_path / "c", "Qwen3ForCausalLM", seed=4)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert (first / "model.safetensors").read_bytes() != (other_seed / "model.safetensors").read_bytes()


def test_tiny_model_folder_has_matching_vocab_and_eos(tmp_path: Path) -> None:
    folder = make_tiny_model(tmp_path / "llama", "LlamaForCausalLM")
    config = load_hf_config(folder)
    tokenizer = load_tokenizer(folder)
    assert config.vocab_size == len(tokenizer)
    assert load_eos_token_ids(folder, config) == [tokenizer.eos_token_id]
    assert config.rope_scaling["rope_type"] == "llama3"


def test_tiny_model_path_creates_once_then_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITONLLM_CACHE", str(tmp_path))
    path = tiny_model_path("MistralForCausalLM")
    assert path == tmp_path / "tiny" / f"v{TINY_MODEL_VERSION}" / "MistralForCausalLM"
    written = (path / "model.safetensors").stat().st_mtime_ns
    assert tiny_model_path("MistralForCausalLM") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == written
    assert [p.name for p in path.parent.iterdir()] == ["MistralForCausalLM"]  # no temp folders left


def test_unknown_tiny_architecture_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        make_tiny_model(tmp_path / "x", "GPT2LMHeadModel")
