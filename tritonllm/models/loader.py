"""Build the model for a local HF folder (or a GGUF file) and fill it with its weights."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn
from transformers import PretrainedConfig

from tritonllm.distributed.parallel_state import SINGLE, TensorParallel
from tritonllm.kernels.registry import OPS
from tritonllm.layers.attention import Attention
from tritonllm.layers.linear import Linear
from tritonllm.layers.moe import FusedMoE
from tritonllm.layers.rotary import RotaryEmbedding, rope_max_position, rope_parameters
from tritonllm.loader.gguf_loader import GGUFCheckpoint, gguf_file
from tritonllm.loader.hf_config import load_hf_config
from tritonllm.loader.random_weights import random_weights
from tritonllm.loader.safetensors_loader import iterate_safetensors
from tritonllm.models.registry import get_model_class
from tritonllm.quantization.config import quant_config

logger = logging.getLogger(__name__)


LOAD_FORMATS = ("auto", "dummy")


def load_model(
    path: str | Path,
    dtype: torch.dtype,
    device: torch.device | str,
    quantization: str | None = None,
    load_format: str = "auto",
    tp: TensorParallel = SINGLE,
) -> tuple[nn.Module, PretrainedConfig]:
    """(model in eval mode with its weights on `device`, the folder's HF config). Linear layers are
    quantized as the checkpoint's quantization_config says, or online per `quantization`
    (quantization/config.py), or as a GGUF file's tensors are (loader/gguf_loader.py); the rest is
    in `dtype`. load_format "dummy": random weights in the checkpoint's layout, made on `device`
    (loader/random_weights.py; every rank makes the same, from one seed); the folder needs only
    config.json. With tensor parallelism, this rank's shard, read from its slices of the tensors."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format={load_format!r} is not one of {LOAD_FORMATS}")
    gguf = gguf_file(path) if load_format == "auto" else None
    if load_format == "dummy":
        config = load_hf_config(path, weights=False)
        quant = quant_config(config, quantization)
        weights = random_weights(config, device)
    elif gguf is not None:  # llama.cpp's single-file format (loader/gguf_loader.py)
        if tp.size > 1:
            raise ValueError("GGUF files cannot be split across tensor-parallel ranks: use tensor_parallel_size=1")
        checkpoint = GGUFCheckpoint(gguf)
        config, quant = checkpoint.config, checkpoint.quant_config(quantization)
        weights = checkpoint.weights(dtype, device)
    else:
        config = load_hf_config(path)
        quant = quant_config(config, quantization)
        weights = iterate_safetensors(path, lazy=tp.size > 1)
    model = get_model_class(config)(config, dtype, device, quant, tp)
    model.load_weights(weights)
    if quant is not None:
        logger.info("quantization: %s; linear formats %s", quant.describe(), sorted(linear_formats(model)))
    return model.eval(), config


def model_max_len(config: PretrainedConfig) -> int:
    """The longest sequence the model serves: max_position_embeddings, or longer where its RoPE
    scaling extends the context past it (yarn, dynamic NTK: layers/rotary.py rope_max_position)."""
    max_position = getattr(config, "max_position_embeddings", None)
    if not max_position:
        return 2048
    return max(max_position, rope_max_position(rope_parameters(config)))


def fit_rope_tables(model: nn.Module, max_model_len: int) -> None:
    """Size the model's RoPE cos/sin tables to max_model_len (the length-dependent schedules,
    dynamic NTK and LongRoPE, pick their frequencies from it: layers/rotary.py)."""
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.fit_to(max_model_len)


def linear_formats(model: nn.Module) -> frozenset[str]:
    """The quantized formats of the model's linear layers (kernels/quant_formats.py), for kernel selection."""
    return frozenset(m.format_name for m in model.modules() if isinstance(m, Linear) and m.format_name != "float")


def layer_features(model: nn.Module) -> dict[str, frozenset[str]]:
    """Per op, the optional features the model's layers use (attention: sliding window, sinks, soft-capping;
    moe: its experts' quantized formats)."""
    attention = frozenset().union(*(m.features for m in model.modules() if isinstance(m, Attention)))
    experts = frozenset(m.scheme.format_name for m in model.modules() if isinstance(m, FusedMoE) and m.scheme)
    return {op: used for op, used in (("attention", attention), ("moe", experts)) if used}


def kv_sliding_window(model: nn.Module) -> int | None:
    """The window beyond which no layer reads the KV cache: the largest sliding window when every
    attention layer has one (Mistral-7B-v0.1), else None (some layer sees the whole context)."""
    windows = [m.sliding_window for m in model.modules() if isinstance(m, Attention)]
    return None if not windows or None in windows else max(windows)


def used_ops(model: nn.Module) -> frozenset[str]:
    """The kernel ops a forward of the model calls (every op but `moe` for a dense model)."""
    has_moe = any(isinstance(m, FusedMoE) for m in model.modules())
    return frozenset(op for op in OPS if op != "moe" or has_moe)
