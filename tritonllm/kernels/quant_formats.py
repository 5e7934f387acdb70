"""What a quantized linear layer hands its kernels: the scheme, the weight as stored, and its scales.

A `QuantScheme` names the weight's storage dtype, how its scales are laid out, and how the
activations are quantized before the GEMM:

| weight_scale | scale tensor                                       | used by                                   |
|--------------|----------------------------------------------------|-------------------------------------------|
| channel      | float32 [N] (a per-tensor scale is stored expanded) | FP8/INT8 per-tensor and per-channel       |
| block        | float32 [cdiv(N, 128), cdiv(K, 128)]               | FP8 block-wise (DeepSeek-V3, Qwen3-FP8)   |
| mx           | uint8 e8m0 [N, K / 32]: scale = 2 ** (e - 127)     | MXFP8 (OCP microscaling)                  |

| act    | activations                                                                       |
|--------|-----------------------------------------------------------------------------------|
| token  | dynamic, one scale per token (row): amax / qmax                                   |
| tensor | static, one scale from the checkpoint (`input_scale`)                             |
| group  | dynamic, one scale per token and 128 columns (1 x 128 groups), for block weights  |
| mx     | dynamic MX: e4m3 values and one e8m0 scale per token and 32 columns               |
| none   | weight-only (W8A16): activations stay in the model's dtype, the weight is widened |

Weights are [N, K] (HF's [out_features, in_features]); y = x @ dequant(w).T + bias. `format_name`
strings ("fp8:block:group") are what registered linear implementations declare they serve.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
WEIGHT_SCALES = ("channel", "block", "mx")
ACT_SCHEMES = ("token", "tensor", "group", "mx", "none")
BLOCK = 128  # block-wise weight scales: 128 x 128; their activation groups: 1 x 128
MX_GROUP = 32  # OCP microscaling: one e8m0 scale per 32 elements along K
FLOAT_FORMAT = "float"  # an unquantized layer


@dataclass(frozen=True)
class QuantScheme:
    weight_dtype: torch.dtype  # float8_e4m3fn (e4m3fnuz on MI300) or int8
    weight_scale: str  # one of WEIGHT_SCALES
    act: str  # one of ACT_SCHEMES

    def __post_init__(self) -> None:
        if self.weight_dtype not in (*FP8_DTYPES, torch.int8):
            raise ValueError(f"quantized weights are FP8 e4m3 or int8, not {self.weight_dtype}")
        if self.weight_scale not in WEIGHT_SCALES or self.act not in ACT_SCHEMES:
            raise ValueError(
                f"weight_scale {self.weight_scale!r} / act {self.act!r}: not {WEIGHT_SCALES} / {ACT_SCHEMES}"
            )
        pairs = {"block": ("group", "none"), "mx": ("mx",), "channel": ("token", "tensor", "none")}
        if self.act not in pairs[self.weight_scale]:
            raise ValueError(
                f"{self.weight_scale} weight scales go with activations {pairs[self.weight_scale]}, not {self.act!r}"
            )
        if self.weight_dtype == torch.int8 and self.weight_scale != "channel":
            raise ValueError("int8 weights take per-channel (or per-tensor) scales")

    @property
    def is_fp8(self) -> bool:
        return self.weight_dtype in FP8_DTYPES

    @property
    def format_name(self) -> str:
        kind = "mxfp8" if self.weight_scale == "mx" else ("fp8" if self.is_fp8 else "int8")
        return f"{kind}:{self.weight_scale}:{self.act}"

    def activation_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """What the GEMM's A operand is: the weight's dtype (W8A8), or the model's (weight-only)."""
        return model_dtype if self.act == "none" else self.weight_dtype


@dataclass
class QuantizedWeight:
    """A layer's quantized weight as the kernels read it (layouts in the module docstring)."""

    scheme: QuantScheme
    data: torch.Tensor  # [N, K] in scheme.weight_dtype
    scale: torch.Tensor  # see the table above
    input_scale: torch.Tensor | None = None  # float32 [1]: the static activation scale (act "tensor")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.data.shape)


@dataclass
class QuantizedActivation:
    """Activations quantized per token (or with one static scale) by the op before a quantized linear
    layer (RMSNorm or SiLU-mul with quantization fused in): the layer's GEMM reads them as they are."""

    data: torch.Tensor  # [M, K] in the weight's dtype (FP8 e4m3 or int8)
    scale: torch.Tensor  # float32 [M, 1] (dynamic per token) or [1] (static: 1-D tells them apart)
    dtype: torch.dtype  # the model's dtype: what the layer returns

    @property
    def shape(self) -> torch.Size:
        return self.data.shape


def qmax(dtype: torch.dtype) -> float:
    """The largest magnitude a quantized value of `dtype` holds (int8: 127, symmetric)."""
    return 127.0 if dtype == torch.int8 else float(torch.finfo(dtype).max)
