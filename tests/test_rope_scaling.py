"""RoPE scaling schedules (yarn, dynamic NTK, longrope, linear) against transformers' own
ROPE_INIT_FUNCTIONS on the published configs that use them, and a tiny yarn Qwen2 model against
HF's logprobs end to end."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from tritonllm.kernels.registry import bind_kernels, select_kernels
from tritonllm.layers.rotary import (
    RotaryEmbedding,
    attention_factor,
    build_cos_sin_cache,
    inverse_frequencies,
    rope_max_position,
    rope_parameters,
)
from tritonllm.models.llama import LlamaForCausalLM
from tritonllm.models.loader import load_model, model_max_len


def _qwen25_yarn() -> transformers.PretrainedConfig:
    """Qwen2.5-7B-Instruct with the yarn block its model card adds for 128k contexts."""
    return transformers.Qwen2Config(
        hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
        rope_theta=1000000.0,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    )  # fmt: skip


def _gpt_oss() -> transformers.PretrainedConfig:
    """openai/gpt-oss-20b's RoPE as published."""
    return transformers.GptOssConfig(
        hidden_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rope_scaling={
            "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
            "original_max_position_embeddings": 4096, "rope_theta": 150000.0,
        },
    )  # fmt: skip


def _deepseek_style_yarn() -> transformers.PretrainedConfig:
    """mscale / mscale_all_dim (DeepSeek-V3's yarn), on a Llama config so HF takes the keys as they are."""
    return transformers.LlamaConfig(
        hidden_size=1024, num_attention_heads=8, max_position_embeddings=163840, rope_theta=10000.0,
        rope_scaling={
            "rope_type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
            "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
        },
    )  # fmt: skip


def _phi3_longrope() -> transformers.PretrainedConfig:
    """Phi-3-mini-128k's shape: head_dim 96, original context 4096 beside rope_scaling, 131072 positions."""
    short = [1.0 + 0.005 * i for i in range(48)]
    long = [1.0 + 0.9 * i for i in range(48)]
    return transformers.Phi3Config(
        hidden_size=3072, num_attention_heads=32, max_position_embeddings=131072, original_max_position_embeddings=4096,
        rope_theta=10000.0, rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long},
    )  # fmt: skip


def _dynamic() -> transformers.PretrainedConfig:
    return transformers.LlamaConfig(
        hidden_size=4096, num_attention_heads=32, max_position_embeddings=4096, rope_theta=10000.0,
        rope_scaling={"rope_type": "dynamic", "factor": 2.0},
    )  # fmt: skip


def _head_dim(config: transformers.PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _assert_matches_hf(config, max_position: int, hf_seq_len: int | None) -> None:
    params = rope_parameters(config)
    hf_inv_freq, hf_attention_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, seq_len=hf_seq_len)
    inv_freq = inverse_frequencies(_head_dim(config), params, max_position)
    assert inv_freq.dtype == torch.float32
    torch.testing.assert_close(inv_freq, hf_inv_freq, atol=0, rtol=1.2e-7)  # one float32 ulp
    assert attention_factor(params) == pytest.approx(hf_attention_factor, rel=1e-7)


@pytest.mark.parametrize("make", [_qwen25_yarn, _gpt_oss, _deepseek_style_yarn], ids=["qwen2.5", "gpt-oss", "mscale"])
def test_yarn_matches_hf(make) -> None:
    config = make()
    params = rope_parameters(config)
    assert params["rope_type"] == "yarn"
    _assert_matches_hf(config, rope_max_position(params), None)
    assert attention_factor(params) != 1.0


def test_yarn_extends_the_context_to_original_times_factor() -> None:
    assert model_max_len(_qwen25_yarn()) == 131072  # 32768 * 4, beyond max_position_embeddings
    assert model_max_len(_gpt_oss()) == 131072
    assert model_max_len(_dynamic()) == 8192
    assert model_max_len(_phi3_longrope()) == 131072


def test_longrope_picks_short_or_long_factors_by_max_model_len() -> None:
    config = _phi3_longrope()
    assert rope_parameters(config)["original_max_position_embeddings"] == 4096
    _assert_matches_hf(config, 4096, None)  # short factors: HF's choice within the original context
    _assert_matches_hf(config, 131072, 4097)  # long factors: HF's choice past it
    assert not torch.equal(
        inverse_frequencies(96, rope_parameters(config), 4096), inverse_frequencies(96, rope_parameters(config), 4097)
    )


def test_dynamic_ntk_uses_hf_frequencies_for_the_longest_sequence() -> None:
    config = _dynamic()
    _assert_matches_hf(config, 4096, None)  # within the original context: HF's plain frequencies
    _assert_matches_hf(config, 8192, 8192)  # the default table (vLLM's): HF's for an 8192-token sequence
    _assert_matches_hf(config, 6000, 6000)


def test_linear_matches_hf() -> None:
    config = transformers.LlamaConfig(
        hidden_size=512, num_attention_heads=4, rope_scaling={"rope_type": "linear", "factor": 4.0}
    )
    _assert_matches_hf(config, config.max_position_embeddings, None)


def test_fit_to_resizes_the_table_and_rechooses_length_dependent_frequencies() -> None:
    config = _dynamic()
    params = rope_parameters(config)
    rope = RotaryEmbedding(128, 128, rope_max_position(params), params)
    assert rope.cos_sin_cache.shape == (8192, 128)
    rope.fit_to(1024)
    hf_inv_freq, _ = ROPE_INIT_FUNCTIONS["dynamic"](config)
    torch.testing.assert_close(rope.cos_sin_cache, build_cos_sin_cache(1024, hf_inv_freq), atol=0, rtol=0)


def test_unsupported_rope_type_is_refused_naming_the_supported_ones() -> None:
    params = {"rope_type": "proportional", "rope_theta": 10000.0, "max_position_embeddings": 64}
    with pytest.raises(ValueError, match=r"'proportional' is not supported \(supported: default, linear, llama3, yarn"):
        inverse_frequencies(64, params)


def _tiny_yarn_qwen2(path) -> transformers.PretrainedConfig:
    """Two layers, head_dim 32, yarn factor 4 over an original context of 32 positions: prompts
    past it exercise the interpolated, ramped and extrapolated dimensions and the attention factor."""
    config = transformers.Qwen2Config(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128, rope_theta=10000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 8.0},
        architectures=["Qwen2ForCausalLM"],
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.Qwen2ForCausalLM(config).float()
        with torch.no_grad():
            for param in model.parameters():
                param.normal_(0.0, 0.2)
    model.save_pretrained(path)
    return model.eval()


def test_tiny_yarn_qwen2_matches_hf_log_probs(tmp_path) -> None:
    from tests.test_models_vs_hf import BLOCK_SIZE, _prefill_metadata

    hf = _tiny_yarn_qwen2(tmp_path)
    model, config = load_model(tmp_path, torch.float32, "cpu")
    assert isinstance(model, LlamaForCausalLM)
    bind_kernels(model, select_kernels(default="torch_ref"))  # the RoPE kernel itself is unchanged
    prompt_lens = (20, 100)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=gen) for n in prompt_lens]
    meta, num_blocks = _prefill_metadata(prompt_lens)
    shape = (num_blocks, BLOCK_SIZE, model.num_kv_heads, model.head_dim)
    kv_caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(model.num_layers)]
    positions = torch.cat([torch.arange(n) for n in prompt_lens])
    with torch.inference_mode():
        logits = model.compute_logits(model(torch.cat(prompts), positions, kv_caches, meta))
        expected = torch.cat([hf(p[None]).logits[0].log_softmax(-1) for p in prompts])
    torch.testing.assert_close(logits.log_softmax(-1), expected, atol=1e-4, rtol=0)
