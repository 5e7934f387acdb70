"""Build the model for a local HF folder and fill it with the folder's weights."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import PretrainedConfig

from tritonllm.loader.hf_config import load_hf_config
from tritonllm.loader.safetensors_loader import iterate_safetensors
from tritonllm.models.registry import get_model_class


def load_model(path: str | Path, dtype: torch.dtype, device: torch.device | str) -> tuple[nn.Module, PretrainedConfig]:
    """(model in eval mode with its weights in `dtype` on `device`, the folder's HF config)."""
    config = load_hf_config(path)
    model = get_model_class(config)(config, dtype, device)
    model.load_weights(iterate_safetensors(path))
    return model.eval(), config
