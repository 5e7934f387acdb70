"""tritonllm: an LLM inference engine whose hot paths are Triton kernels (CUDA and ROCm)."""

from tritonllm import platform  # noqa: F401  (first: switches on Triton's interpreter on CPU)

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]
__version__ = "0.1.0"

_PUBLIC = {
    "LLM": "tritonllm.entrypoints.llm",
    "SamplingParams": "tritonllm.sampling_params",
    "RequestOutput": "tritonllm.outputs",
    "CompletionOutput": "tritonllm.outputs",
    "Logprob": "tritonllm.outputs",
}


def __getattr__(name: str):
    # Lazy, so that importing a kernel module does not load the whole engine.
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(name)
