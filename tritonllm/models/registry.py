"""HF architecture name (config.architectures[0]) -> the model class that serves it."""

from __future__ import annotations

from torch import nn
from transformers import PretrainedConfig

from tritonllm.models.llama import LlamaForCausalLM
from tritonllm.models.moe import MoEForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
    "MixtralForCausalLM": MoEForCausalLM,
    "Qwen2MoeForCausalLM": MoEForCausalLM,
    "Qwen3MoeForCausalLM": MoEForCausalLM,
    "GptOssForCausalLM": MoEForCausalLM,
}


def get_model_class(config: PretrainedConfig) -> type[nn.Module]:
    architectures = getattr(config, "architectures", None) or []
    if not architectures or architectures[0] not in MODEL_REGISTRY:
        raise ValueError(
            f"model architecture {architectures[0] if architectures else None!r} is not supported; "
            f"supported architectures: {', '.join(sorted(MODEL_REGISTRY))}"
        )
    return MODEL_REGISTRY[architectures[0]]
