"""Which accelerator runs the kernels: CUDA, ROCm or none (CPU).

Detected once, at import. Without a GPU the same Triton kernels run under Triton's interpreter,
which must be switched on before any kernel is defined, so every kernel module imports this
module first. A GPU user never sets anything.
"""

from __future__ import annotations

import os

import torch


def _detect() -> str:
    if torch.cuda.is_available():
        return "rocm" if torch.version.hip else "cuda"
    return "cpu"


PLATFORM: str = _detect()

if PLATFORM == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE: torch.device = torch.device("cpu" if PLATFORM == "cpu" else "cuda")
# The interpreter cannot run bfloat16 tl.dot (triton issue 11584): CPU defaults to float32.
DEFAULT_DTYPE: torch.dtype = torch.float32 if PLATFORM == "cpu" else torch.bfloat16


def is_gpu() -> bool:
    return PLATFORM != "cpu"


def is_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def num_multiprocessors() -> int:
    """Streaming multiprocessors (CUDA) or compute units (ROCm); 1 on CPU."""
    if PLATFORM == "cpu":
        return 1
    return torch.cuda.get_device_properties(DEVICE).multi_processor_count


def has_fp8() -> bool:
    """FP8 tensor cores and conversions: NVIDIA compute capability 8.9+ (Ada, Hopper), AMD MI300, or
    the CPU interpreter. Elsewhere FP8 weights are decoded from their bytes (kernels/gemm.py)."""
    if PLATFORM == "cuda":
        return torch.cuda.get_device_capability(DEVICE) >= (8, 9)
    if PLATFORM == "rocm":
        return "gfx94" in torch.cuda.get_device_properties(DEVICE).gcnArchName
    return True


def fp8_e4m3_dtype() -> torch.dtype:
    """The FP8 e4m3 flavour of this GPU: e4m3fnuz on AMD CDNA3 (MI300), e4m3fn elsewhere.
    NVIDIA GPUs before compute capability 8.9 (Ada) have no FP8 conversions: Triton cannot compile
    FP8 kernels for them, so they are refused here with the fix."""
    if PLATFORM == "rocm" and "gfx94" in torch.cuda.get_device_properties(DEVICE).gcnArchName:
        return torch.float8_e4m3fnuz
    if PLATFORM == "cuda" and not has_fp8():
        name = torch.cuda.get_device_name(DEVICE)
        raise ValueError(
            f"an FP8 KV cache needs an NVIDIA GPU of compute capability 8.9 or newer (Ada, Hopper); {name} is "
            f"{torch.cuda.get_device_capability(DEVICE)}: use kv_cache_dtype='auto'"
        )
    return torch.float8_e4m3fn
