"""Rotary position embedding (RoPE) with HF's frequency schedules: "default", "linear", "llama3",
"yarn", "dynamic" (NTK) and "longrope".

The cos/sin table is built once, in float32, exactly as HF transformers computes it (same
inverse frequencies as transformers' ROPE_INIT_FUNCTIONS, same float32 position * inv_freq
products, cos and sin times the same attention factor), so our logits match HF's.

Two schedules depend on the sequence length in HF, which recomputes inv_freq per forward; a
serving engine keeps one table, built for the longest sequence it serves (`max_model_len`,
`RotaryEmbedding.fit_to`; by default the longest the RoPE supports, `rope_max_position`):

- "dynamic": HF uses the plain frequencies up to max_position_embeddings and, past it, a base
  scaled for the current length. We use HF's frequencies for a sequence of max_model_len tokens
  for every sequence (vLLM's DynamicNTKScalingRotaryEmbedding does the same for its default
  max_position_embeddings * factor). With max_model_len <= max_position_embeddings this is HF
  exactly; beyond, sequences shorter than max_model_len get the scaled base where HF would
  not (HF's own KV-cached generation mixes bases as the sequence grows, so it has no one answer).
- "longrope": HF uses short_factor while the sequence fits original_max_position_embeddings and
  long_factor past it. We pick the set once, from max_model_len (long when it exceeds the
  original context), as e.g. vLLM's V1 engine does; with max_model_len <= original this is HF
  exactly, otherwise short prompts get the long factors.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from tritonllm.kernels.registry import default_kernels

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")


def rope_parameters(config: PretrainedConfig) -> dict[str, Any]:
    """The config's RoPE settings as one dict with rope_type and rope_theta, from transformers 5's
    `rope_parameters` or 4.x's `rope_theta` + `rope_scaling` (whose type key was once "type")."""
    params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    params.setdefault("rope_type", params.pop("type", "default"))
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    if params["rope_type"] in ("llama3", "yarn", "longrope"):
        # Phi-3 keeps it beside rope_scaling, and HF then prefers that value
        original = getattr(config, "original_max_position_embeddings", None)
        if original is not None:
            params["original_max_position_embeddings"] = original
        params.setdefault("original_max_position_embeddings", config.max_position_embeddings)
    # "yarn"/"longrope" derive a missing factor from it, "dynamic" scales relative to it
    params.setdefault("max_position_embeddings", config.max_position_embeddings)
    return params


def rope_max_position(params: dict[str, Any]) -> int:
    """The longest sequence the RoPE is made for: max_position_embeddings, or the context the
    scaling extends to when that is longer (as vLLM derives its max_model_len): yarn to
    original_max_position_embeddings * factor (Qwen2.5 keeps 32768 beside yarn factor 4), dynamic
    NTK to max_position_embeddings * factor."""
    max_position = params["max_position_embeddings"]
    if params["rope_type"] == "yarn" and params.get("factor"):
        max_position = max(max_position, int(params["original_max_position_embeddings"] * params["factor"]))
    elif params["rope_type"] == "dynamic":
        max_position = int(max_position * params["factor"])
    return max_position


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


def _yarn_factor(params: dict[str, Any]) -> float:
    factor = params.get("factor")
    # DeepSeek-V3 style configs leave it to the ratio of the two lengths
    return (
        factor if factor is not None else params["max_position_embeddings"] / params["original_max_position_embeddings"]
    )


def _yarn_inv_freq(rotary_dim: int, params: dict[str, Any]) -> torch.Tensor:
    """YaRN: interpolated (divided by factor) below beta_slow rotations over the original context,
    extrapolated (kept) above beta_fast, a linear ramp over the dimensions between."""
    base = params["rope_theta"]
    factor = _yarn_factor(params)
    original = params["original_max_position_embeddings"]
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        return (rotary_dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):  # gpt-oss sets truncate=False
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # as HF: no zero division
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_factor = 1 - ramp
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2).to(dtype=torch.float) / rotary_dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    return inv_freq_interpolation * (1 - extrapolation_factor) + inv_freq_extrapolation * extrapolation_factor


def attention_factor(params: dict[str, Any]) -> float:
    """The factor HF multiplies cos and sin by (so q.k by its square): YaRN's and LongRoPE's
    length-dependent temperature, 1 for the other schedules."""
    rope_type = params["rope_type"]
    given = params.get("attention_factor")
    if rope_type == "yarn":
        if given is not None:
            return given
        factor = _yarn_factor(params)

        def get_mscale(scale: float, mscale: float = 1) -> float:
            return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            return float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        return get_mscale(factor)
    if rope_type == "longrope":
        if given is not None:
            return given
        factor = params.get("factor")
        if factor is None:  # Phi-3: the ratio of the two lengths
            factor = params["max_position_embeddings"] / params["original_max_position_embeddings"]
        if factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(factor) / math.log(params["original_max_position_embeddings"]))
    return 1.0


def inverse_frequencies(rotary_dim: int, params: dict[str, Any], max_position: int | None = None) -> torch.Tensor:
    """inv_freq [rotary_dim / 2] float32 for the rope_type in params; other types are refused.

    `max_position` is the longest sequence the table serves (default: rope_max_position); only
    "dynamic" and "longrope" depend on it (see the module docstring)."""
    rope_type = params["rope_type"]
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_type {rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)}); "
            "serve a model without this RoPE scaling or add its frequency schedule to layers/rotary.py"
        )
    if max_position is None:
        max_position = rope_max_position(params)
    base = params["rope_theta"]
    if rope_type == "dynamic":  # HF's NTK-aware base for a sequence of max_position tokens
        factor, trained = params["factor"], params["max_position_embeddings"]
        seq_len = max(max_position, trained)
        base = base * ((factor * seq_len / trained) - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))
    if rope_type == "yarn":
        inv_freq = _yarn_inv_freq(rotary_dim, params)
    else:
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device="cpu").float() / rotary_dim
        if rope_type == "longrope":
            long = max_position > params["original_max_position_embeddings"]
            ext_factors = torch.tensor(params["long_factor" if long else "short_factor"], dtype=torch.float32)
            inv_freq = 1.0 / (ext_factors * base**exponents)
        else:
            inv_freq = 1.0 / (base**exponents)
    if rope_type == "linear":
        inv_freq = inv_freq / params["factor"]
    if rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, params)
    if "freq_factors" in params:  # a GGUF file's rope_freqs: llama.cpp divides each frequency by its factor
        inv_freq = inv_freq / torch.tensor(params["freq_factors"], dtype=torch.float32)
    return inv_freq


def build_cos_sin_cache(max_position: int, inv_freq: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """[max_position, rotary_dim] float32: cos(pos * inv_freq) in the first half, sin in the
    second, each times `scale` (the attention factor)."""
    positions = torch.arange(max_position, dtype=torch.int64, device=inv_freq.device).float()
    freqs = positions[:, None] * inv_freq.float()[None, :]
    if scale == 1.0:
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    return torch.cat([freqs.cos() * scale, freqs.sin() * scale], dim=-1)


def rope_cos_sin_cache(rotary_dim: int, params: dict[str, Any], max_position: int) -> torch.Tensor:
    """The table for positions [0, max_position) of a model whose RoPE settings are `params`."""
    inv_freq = inverse_frequencies(rotary_dim, params, max_position)
    return build_cos_sin_cache(max_position, inv_freq, attention_factor(params))


class RotaryEmbedding(nn.Module):
    """Rotates q and k per head in the NeoX layout (dim i pairs with i + rotary_dim/2), as HF's
    Llama/Mistral/Qwen do; head dims past rotary_dim pass through."""

    is_neox = True

    def __init__(self, head_dim: int, rotary_dim: int, max_position: int, params: dict[str, Any]) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.params = params
        self.kernels = default_kernels()  # the engine binds its own (kernels/registry.py)
        # built on the CPU, so every platform gets the same table, then moved to the model's device
        cache = rope_cos_sin_cache(rotary_dim, params, max_position)
        self.register_buffer("cos_sin_cache", cache.to(torch.get_default_device()), persistent=False)

    def fit_to(self, max_model_len: int) -> None:
        """Rebuild the table for sequences of at most max_model_len tokens: only that many rows,
        and "dynamic"/"longrope" frequencies chosen for that length (module docstring)."""
        if max_model_len == self.cos_sin_cache.shape[0]:
            return
        cache = rope_cos_sin_cache(self.rotary_dim, self.params, max_model_len)
        self.cos_sin_cache = cache.to(self.cos_sin_cache.device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [num_tokens]; q [num_tokens, num_heads * head_dim]; k [num_tokens, num_kv_heads *
        head_dim]. Returns rotated (q, k)."""
        return self.kernels.rotary_embedding(positions, q, k, self.cos_sin_cache, self.head_dim, self.is_neox)
