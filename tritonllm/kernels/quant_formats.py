"""What a quantized linear layer hands its kernels: the scheme, the weight as stored, and its scales.

A `QuantScheme` names the weight's storage dtype, how its scales are laid out, and how the
activations are quantized before the GEMM:

| weight_scale | scale tensor                                       | used by                                   |
|--------------|----------------------------------------------------|-------------------------------------------|
| channel      | float32 [N] (a per-tensor scale is stored expanded) | FP8/INT8 per-tensor and per-channel       |
| block        | float32 [cdiv(N, 128), cdiv(K, 128)]               | FP8 block-wise (DeepSeek-V3, Qwen3-FP8)   |
| mx           | uint8 e8m0 [N, K / 32]: scale = 2 ** (e - 127)     | MXFP8, MXFP4 (OCP microscaling)           |
| group        | float16 (or float32) [N, K / G] scales and zero    | INT4 / UINT8 weight-only:                 |
|              | points                                             | w = (q - zero) * scale                    |

Weight dtypes: FP8 e4m3 and int8 as such; INT4 (`torch.quint4x2`, unsigned 0..15) and FP4 (MXFP4's
e2m1, `torch.float4_e2m1fn_x2`) stored packed, uint8 [N, K / 2], the low nibble holding the even
column and the high nibble the odd one; UINT8 (`torch.uint8`, 0..255 with zero points: 8-bit GPTQ,
GGUF's 5- to 8-bit types) as uint8 [N, K]. G is the scheme's `group_size` along K.

| act    | activations                                                                       |
|--------|-----------------------------------------------------------------------------------|
| token  | dynamic, one scale per token (row): amax / qmax                                   |
| tensor | static, one scale from the checkpoint (`input_scale`)                             |
| group  | dynamic, one scale per token and 128 columns (1 x 128 groups), for block weights  |
| mx     | dynamic MX: e4m3 values and one e8m0 scale per token and 32 columns               |
| none   | weight-only (W8A16, W4A16): activations stay in the model's dtype, the weight is   |
|        | widened (or decoded) in the kernel                                                |

Weights are [N, K] (HF's [out_features, in_features]); y = x @ dequant(w).T + bias. `format_name`
strings ("fp8:block:group") are what registered linear implementations declare they serve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
WEIGHT_SCALES = ("channel", "block", "mx", "group")
INT4 = torch.quint4x2  # the scheme's marker for packed 4-bit unsigned weights (stored as uint8 pairs)
FP4 = torch.float4_e2m1fn_x2  # packed e2m1 pairs (MXFP4), stored as uint8
UINT8 = torch.uint8  # 8-bit unsigned weights with per-group zero points
GROUPED_INTS = (INT4, UINT8)  # integer weights with per-group scales and zero points
ACT_SCHEMES = ("token", "tensor", "group", "mx", "none")
BLOCK = 128  # block-wise weight scales: 128 x 128; their activation groups: 1 x 128
MX_GROUP = 32  # OCP microscaling: one e8m0 scale per 32 elements along K
FLOAT_FORMAT = "float"  # an unquantized layer
# activation schemes that the op before a linear layer can quantize for it in its own kernel (RMSNorm,
# SiLU-mul: kernels/quant.py quantize_rows_and_store): per token, static per tensor, per 1 x 128 group
FUSABLE_ACTS = ("token", "tensor", "group")


def activation_group(scheme: QuantScheme) -> int:
    """The column group of one activation scale when the op before quantizes for `scheme`: BLOCK for
    block-FP8's 1 x 128 groups, 0 for one scale a row (or a static one)."""
    return BLOCK if scheme.act == "group" else 0


class OutputQuant(NamedTuple):
    """How an op quantizes its output for the next linear layer (that layer's scheme: the ops' `quantize_for`):
    into `dtype`, per token, with `static_scale` (float32 [1]) if given, or per `group` columns (BLOCK)."""

    dtype: torch.dtype
    static_scale: torch.Tensor | None = None
    group: int = 0

    @staticmethod
    def of(weight: QuantizedWeight) -> OutputQuant:
        return OutputQuant(weight.scheme.weight_dtype, weight.input_scale, activation_group(weight.scheme))


@dataclass(frozen=True)
class QuantScheme:
    weight_dtype: torch.dtype  # float8_e4m3fn (e4m3fnuz on MI300), int8, INT4 / FP4 (packed) or UINT8
    weight_scale: str  # one of WEIGHT_SCALES
    act: str  # one of ACT_SCHEMES
    group_size: int = 0  # "group" scales: columns of K per scale and zero point (-1: K, set per layer)

    def __post_init__(self) -> None:
        if self.weight_dtype not in (*FP8_DTYPES, torch.int8, *GROUPED_INTS, FP4):
            raise ValueError(f"quantized weights are FP8 e4m3, int8, int4, uint8 or fp4, not {self.weight_dtype}")
        if (self.weight_dtype in GROUPED_INTS) != (self.weight_scale == "group"):
            raise ValueError("int4 and uint8 weights, and only they, take per-group scales and zero points")
        if self.weight_scale == "group" and self.group_size != -1 and (self.group_size <= 0 or self.group_size % 2):
            raise ValueError(f"group size {self.group_size}: a positive even number of columns (-1: all of K)")
        if self.weight_dtype == FP4 and (self.weight_scale, self.act) != ("mx", "none"):
            raise ValueError("fp4 (MXFP4) weights take e8m0 scales per 32 columns and unquantized activations")
        if self.weight_scale == "mx" and self.act == "none" and self.weight_dtype != FP4:
            raise ValueError("MXFP8 weights go with MX-quantized activations (act 'mx'); weight-only MX is fp4")
        if self.weight_scale not in WEIGHT_SCALES or self.act not in ACT_SCHEMES:
            raise ValueError(
                f"weight_scale {self.weight_scale!r} / act {self.act!r}: not {WEIGHT_SCALES} / {ACT_SCHEMES}"
            )
        pairs = {
            "block": ("group", "none"),
            "mx": ("mx", "none"),
            "channel": ("token", "tensor", "none"),
            "group": ("none",),
        }
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
    def is_int4(self) -> bool:
        return self.weight_dtype == INT4

    @property
    def packed(self) -> bool:
        """Two 4-bit values a byte (INT4, FP4)."""
        return self.weight_dtype in (INT4, FP4)

    @property
    def format_name(self) -> str:
        names = {INT4: "int4", UINT8: "uint8", FP4: "mxfp4", torch.int8: "int8"}
        kind = "mxfp8" if self.weight_scale == "mx" and self.is_fp8 else names.get(self.weight_dtype, "fp8")
        return f"{kind}:{self.weight_scale}:{self.act}"

    def activation_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """What the GEMM's A operand is: the weight's dtype (W8A8), or the model's (weight-only)."""
        return model_dtype if self.act == "none" else self.weight_dtype


@dataclass
class QuantizedWeight:
    """A layer's quantized weight as the kernels read it (layouts in the module docstring)."""

    scheme: QuantScheme
    data: torch.Tensor  # [N, K] in scheme.weight_dtype (int4, fp4: uint8 [N, K / 2]; uint8 [N, K])
    scale: torch.Tensor  # see the table above
    input_scale: torch.Tensor | None = None  # float32 [1]: the static activation scale (act "tensor")
    zeros: torch.Tensor | None = None  # float16/32 [N, K / G]: int4 / uint8 zero points, in quantized units
    # int64 [K]: data's columns are the input's columns in this order (GPTQ act order, sorted by
    # group at load); the activations are permuted the same way before the GEMM
    perm: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """[N, K] of the matrix it stands for."""
        n, k = self.data.shape
        return (n, 2 * k) if self.scheme.packed else (n, k)


@dataclass
class QuantizedActivation:
    """Activations quantized per token (or with one static scale) by the op before a quantized linear
    layer (RMSNorm or SiLU-mul with quantization fused in): the layer's GEMM reads them as they are."""

    data: torch.Tensor  # [M, K] in the weight's dtype (FP8 e4m3 or int8)
    # float32 [M, 1] (dynamic per token), [1] (static: 1-D tells them apart) or [M, K / 128] (per 1 x 128 group,
    # column-major as quant.fused_scales lays them out: block-FP8's, or a linear implementation's input_quant)
    scale: torch.Tensor
    dtype: torch.dtype  # the model's dtype: what the layer returns

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def grouped(self) -> bool:
        """Scales of 1 x 128 column groups (more than one a row)."""
        return self.scale.dim() == 2 and self.scale.shape[1] > 1


def qmax(dtype: torch.dtype) -> float:
    """The largest magnitude a quantized value of `dtype` holds (int8: 127, symmetric; int4: 15,
    unsigned with a zero point; uint8: 255; fp4 e2m1: 6)."""
    return {torch.int8: 127.0, INT4: 15.0, UINT8: 255.0, FP4: 6.0}.get(dtype) or float(torch.finfo(dtype).max)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[N, K] integers in 0..15 -> uint8 [N, K / 2], the even column in the low nibble."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K / 2] -> uint8 [N, K] values 0..15 (pack_int4's inverse)."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


# e2m1 (OCP FP4) code -> value: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """uint8 e2m1 codes (0..15) -> float32 values."""
    return torch.tensor(E2M1_VALUES, device=codes.device)[codes.long()]
