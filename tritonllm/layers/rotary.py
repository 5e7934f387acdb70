"""Rotary position embedding (RoPE) with HF's frequency schedules: "default" and "llama3".

The cos/sin table is built once, in float32, exactly as HF transformers computes it (same
inverse frequencies, same float32 position * inv_freq products), so our logits match HF's.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from tritonllm.kernels.registry import default_kernels

SUPPORTED_ROPE_TYPES = ("default", "llama3")


def rope_parameters(config: PretrainedConfig) -> dict[str, Any]:
    """The config's RoPE settings as one dict with rope_type and rope_theta, from transformers 5's
    `rope_parameters` or 4.x's `rope_theta` + `rope_scaling` (whose type key was once "type")."""
    params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    params.setdefault("rope_type", params.pop("type", "default"))
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    if params["rope_type"] == "llama3":
        params.setdefault("original_max_position_embeddings", config.max_position_embeddings)
    return params


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's schedule: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between."""
    factor = params["factor"]
    low_freq_factor = params["low_freq_factor"]
    high_freq_factor = params["high_freq_factor"]
    old_context_len = params["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def inverse_frequencies(rotary_dim: int, params: dict[str, Any]) -> torch.Tensor:
    """inv_freq [rotary_dim / 2] float32 for the rope_type in params; other types are refused."""
    rope_type = params["rope_type"]
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_type {rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)}); "
            "serve a model without this RoPE scaling or add its frequency schedule to layers/rotary.py"
        )
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device="cpu").float() / rotary_dim
    inv_freq = 1.0 / (params["rope_theta"] ** exponents)
    if rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, params)
    if "freq_factors" in params:  # a GGUF file's rope_freqs: llama.cpp divides each frequency by its factor
        inv_freq = inv_freq / torch.tensor(params["freq_factors"], dtype=torch.float32)
    return inv_freq


def build_cos_sin_cache(max_position: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """[max_position, rotary_dim] float32: cos(pos * inv_freq) in the first half, sin in the second."""
    positions = torch.arange(max_position, dtype=torch.int64, device=inv_freq.device).float()
    freqs = positions[:, None] * inv_freq.float()[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotates q and k per head in the NeoX layout (dim i pairs with i + rotary_dim/2), as HF's
    Llama/Mistral/Qwen do; head dims past rotary_dim pass through."""

    def __init__(self, head_dim: int, rotary_dim: int, max_position: int, params: dict[str, Any]) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.kernels = default_kernels()  # the engine binds its own (kernels/registry.py)
        # built on the CPU, so every platform gets the same table, then moved to the model's device
        cache = build_cos_sin_cache(max_position, inverse_frequencies(rotary_dim, params))
        self.register_buffer("cos_sin_cache", cache.to(torch.get_default_device()), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [num_tokens]; q [num_tokens, num_heads * head_dim]; k [num_tokens, num_kv_heads *
        head_dim]. Returns rotated (q, k)."""
        return self.kernels.rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_dim, True)
