"""The Triton implementation of the linear op: unquantized layers and every quantized format
(kernels/quant_formats.py) through one GEMM family (kernels/gemm.py), activations quantized first
by kernels/quant.py where the scheme quantizes them."""

from __future__ import annotations

import torch

from tritonllm import platform
from tritonllm.kernels import gemm as g
from tritonllm.kernels import gemm_skinny_fused_sm90, gemm_skinny_sm90, gemv_w4_sm90
from tritonllm.kernels.activation import silu_and_mul_amax
from tritonllm.kernels.launch import pdl_launch
from tritonllm.kernels.quant import quantize_per_group, quantize_rows
from tritonllm.kernels.quant_formats import BLOCK, OutputQuant, QuantizedActivation, QuantizedWeight
from tritonllm.kernels.registry import FLOATS, Supports, register

TRITON_FORMATS = frozenset({
    "fp8:channel:token", "fp8:channel:tensor", "fp8:channel:none", "fp8:block:group", "fp8:block:none",
    "int8:channel:token", "int8:channel:tensor", "int8:channel:none", "mxfp8:mx:mx", "int4:group:none",
    "uint8:group:none", "mxfp4:mx:none",
})  # fmt: skip
LINEAR_SUPPORTS = Supports(dtypes=FLOATS, linear_formats=TRITON_FORMATS, features=frozenset({"split_k"}))
# the same GEMM family, with the Hopper Gluon kernels where they were measured faster: for 4-bit weights
# the GEMV (kernels/gemv_w4_sm90.py) at M = 1 and the tensor-core GEMM (kernels/gemm_w4_sm90.py) at
# M = 2..64, for bf16 / fp16 / FP8 W8A8 the skinny TMA GEMM (kernels/gemm_skinny_sm90.py) at M = 1..64;
# auto prefers it to `triton` where it is available (and cuBLAS, priority 20, still takes unquantized models)
SM90_SUPPORTS = Supports(
    dtypes=frozenset({torch.bfloat16, torch.float16}), platforms=frozenset({"cuda"}), linear_formats=TRITON_FORMATS,
    features=frozenset({"split_k", "gluon_sm90"}), available=gemv_w4_sm90.unavailable,
)  # fmt: skip


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


@register("linear", "triton", supports=LINEAR_SUPPORTS, priority=10)
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, gluon: bool = False) -> torch.Tensor:
    """gluon: the Hopper Gluon kernels where measured faster (the `triton_sm90` implementation)."""
    y = g.gemm(_rows(x), weight, bias, sm90="faster" if gluon else "never")
    return y.view(*x.shape[:-1], weight.shape[0])


@register("linear", "triton")
def quantized_linear(
    x: torch.Tensor | QuantizedActivation,
    weight: QuantizedWeight,
    bias: torch.Tensor | None,
    *,
    gluon: bool = False,
) -> torch.Tensor:
    """x in the model's dtype (quantized here per weight.scheme.act), or a QuantizedActivation that
    the op before quantized per token (RMSNorm / SiLU-mul with quantization fused in). gluon: the
    Hopper Gluon kernels where measured faster (the `triton_sm90` implementation)."""
    scheme = weight.scheme
    scales = dict(g.scale_args(scheme), out_dtype=x.dtype, b_scale=weight.scale, sm90="faster" if gluon else "never")
    if isinstance(x, QuantizedActivation):
        if x.grouped and scheme.act == "token":  # per 1 x 128 group, as input_quant asked (attention, SiLU-mul)
            scales.update(a_scale_kind=g.A_GROUP, group_k=BLOCK)
        return g.gemm(x.data, weight.data, bias, a_scale=x.scale, **scales)
    x2 = _rows(x)
    if weight.perm is not None:  # GPTQ act order: the weight's columns were sorted by group at load
        x2 = x2.index_select(1, weight.perm)
    if scheme.act == "none":  # weight-only: the weight tile is widened to x's dtype in the kernel
        data = weight.data
        if scheme.is_fp8 and not platform.has_fp8():  # no FP8 conversions here: the kernel decodes bytes
            data = data.view(torch.uint8)
        y = g.gemm(x2, data, bias, b_zero=weight.zeros, **scales)
    elif scheme.act == "mx":  # 1 x 32 e8m0 scales both sides
        q, scale = quantize_per_group(x2, scheme.weight_dtype, scales["group_k"], mx=True)
        y = g.gemm(q, weight.data, bias, a_scale=scale, **scales)
    else:  # per token, static, or 1 x 128 groups (128 x 128 weight blocks): as a fused op before would quantize
        act = quantize_rows(x2, OutputQuant.of(weight))
        y = g.gemm(act.data, weight.data, bias, a_scale=act.scale, **scales)
    return y.view(*x.shape[:-1], weight.shape[0])


# the most rows at which input_quant asks for 1 x 128 groups: decode sizes, where the skinny sm90 GEMM serves FP8
GROUP_INPUT_MAX_M = 16


@register("linear", "triton", entry="input_quant")
def input_quant(m: int, weight: QuantizedWeight) -> OutputQuant | None:
    """How the op before should quantize an input of m rows for this FP8 W8A8 layer (per-channel weight scales,
    dynamic per-token activation scales) where it differs from the scheme: per 1 x 128 group at decode sizes
    (M <= GROUP_INPUT_MAX_M), which both GEMM paths apply a K step at a time (the skinny sm90 kernel's
    SCALE_GROUP, the portable kernels' A_GROUP) and which no producer needs a row-wide amax for: the split-KV
    attention quantizes o_proj's input in each KV head's merging program, with no second arrival over the token's
    row (kernels/attention_split.py), and the quantizing SiLU-mul spreads down_proj's input row over many programs
    (kernels/activation.py). Finer scales than one a token, never coarser. None: the scheme's own."""
    fits = weight.scheme.format_name == "fp8:channel:token" and weight.data.shape[1] % BLOCK == 0
    return OutputQuant(weight.scheme.weight_dtype, None, BLOCK) if fits and m <= GROUP_INPUT_MAX_M else None


@register("linear", "triton_sm90", entry="linear", supports=SM90_SUPPORTS, priority=15)
def linear_sm90(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return linear(x, weight, bias, gluon=True)


@register("linear", "triton_sm90", entry="quantized_linear")
def quantized_linear_sm90(
    x: torch.Tensor | QuantizedActivation, weight: QuantizedWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    return quantized_linear(x, weight, bias, gluon=True)


register("linear", "triton_sm90", entry="input_quant")(input_quant)


@register("linear", "triton_sm90", entry="gated_linear")
def gated_linear_sm90(
    x: torch.Tensor | QuantizedActivation,
    weight: torch.Tensor | QuantizedWeight,
    bias: torch.Tensor | None,
    quant: OutputQuant | None,
) -> torch.Tensor | QuantizedActivation | None:
    """silu(gate) * up of a gate_up layer (weight [gate | up] [2 I, K]) in the skinny GEMM's epilogue
    (kernels/gemm_skinny_sm90.py), for 16-bit weights or FP8 W8A8 with per-channel scales and an input
    quantized per token, or for 4-bit weights at one row in the W4 GEMV's (_w4_gated); with `quant` (the
    down projection's: FP8, per token, dynamic) the same launch quantizes its output at M <= GATED_QUANT_MAX_M.
    None where the kernel does not serve (the caller runs the GEMM, then the activation op)."""
    if isinstance(weight, QuantizedWeight) and weight.scheme.act == "none":  # weight-only: the 4-bit GEMV's
        return None if quant is not None or isinstance(x, QuantizedActivation) else _w4_gated(x, weight, bias)
    if quant is not None and (quant.dtype != torch.float8_e4m3fn or quant.static_scale is not None or quant.group):
        return None
    if isinstance(weight, QuantizedWeight):
        if weight.scheme.format_name != "fp8:channel:token" or not isinstance(x, QuantizedActivation):
            return None
        a, b, a_scale, b_scale, out_dtype = x.data, weight.data, x.scale, weight.scale, x.dtype
        if a_scale.dim() != 2 or x.grouped or b_scale.dtype != torch.float32 or not b_scale.is_contiguous():
            return None
    elif isinstance(x, QuantizedActivation) or quant is not None:
        return None
    else:
        a, b, a_scale, b_scale, out_dtype = _rows(x), weight, None, None, x.dtype
    if not gemm_skinny_fused_sm90.gated_takes(a, b, quantized=quant is not None):
        return None
    out = gemm_skinny_fused_sm90.gated_skinny_gemm_sm90(
        a, b, bias, a_scale, b_scale, out_dtype, quant.dtype if quant is not None else None, pdl_launch()
    )
    if quant is None:
        return out.view(*x.shape[:-1], out.shape[-1])
    return QuantizedActivation(out[0], out[1], out_dtype)


def _w4_gated(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor | None:
    """silu(gate) * up at one activation row for a 4-bit gate_up (int4 groups, MXFP4): the Hopper GEMV with the
    SiLU-mul in its epilogue (kernels/gemv_w4_sm90.py, GATED); None where it does not serve."""
    args = g.scale_args(weight.scheme)
    a = _rows(x)
    if args["b_decode"] not in (g.DEC_INT4, g.DEC_FP4) or weight.perm is not None or a.shape[0] != 1:
        return None
    words = g.as_words(weight.data)
    if words is None or words.shape[0] % 2 or not gemv_w4_sm90.takes(a, a.shape[1], args["group_k"]):
        return None
    fp4 = args["b_decode"] == g.DEC_FP4
    out = torch.empty((1, words.shape[0] // 2), dtype=a.dtype, device=a.device)
    gemv_w4_sm90.w4_gemv_sm90(a, words, out, bias, weight.scale, None if fp4 else weight.zeros, args["group_k"], fp4,
                              pdl_launch(), gated=True)  # fmt: skip
    return out.view(*x.shape[:-1], out.shape[-1])


def _fp8_token(weight: torch.Tensor | QuantizedWeight) -> bool:
    """FP8 W8A8, per-channel float32 weight scales (contiguous), dynamic per-token activation scales."""
    return (
        isinstance(weight, QuantizedWeight) and weight.scheme.format_name == "fp8:channel:token"
        and weight.input_scale is None and weight.scale.dtype == torch.float32 and weight.scale.is_contiguous()
    )  # fmt: skip


@register("linear", "triton_sm90", entry="silu_mul_linear")
def silu_mul_linear_sm90(
    y: torch.Tensor, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None
) -> torch.Tensor | None:
    """down(silu(gate) * up) for gate_up's output y [..., 2 I] and a down projection in FP8 W8A8 with
    per-channel weight scales and dynamic per-token activation scales, at M <= XQ_MAX_M: the SiLU-mul
    kernel writes h in y's dtype over many programs with its rows' block amaxes, and the skinny GEMM
    quantizes h per token itself while its weight copies stream (gemm_skinny_sm90's XQ mode), so no
    one-program-a-row quantizing activation kernel runs. The values are those of silu_and_mul_quant then
    the GEMM. None elsewhere (the caller runs the activation op, then the layer)."""
    if not _fp8_token(weight):
        return None
    y2 = _rows(y)
    if y2.shape[-1] % 2 or not gemm_skinny_fused_sm90.xq_takes(y2.shape[0], y2.shape[-1] // 2, y2.dtype, weight.data):
        return None
    h, amax = silu_and_mul_amax(y2)
    out = gemm_skinny_fused_sm90.xq_skinny_gemm_sm90(h, amax, weight.data, weight.scale, bias, pdl_launch())
    return out.view(*y.shape[:-1], out.shape[-1])


@register("linear", "triton_sm90", entry="norm_linear")
def norm_linear_sm90(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor | QuantizedWeight,
    bias: torch.Tensor | None,
) -> torch.Tensor | None:  # fmt: skip
    """The layer applied to rms_norm(x) x norm_weight for the residual stream x [..., K], for FP8 W8A8 with
    per-channel weight scales and dynamic per-token activation scales at M <= XN_MAX_M: the skinny GEMM
    normalizes and quantizes x itself (gemm_skinny_sm90's XN mode) with the values of rms_norm_quant, so no
    norm kernel runs before it. None elsewhere (the caller runs the norm, then the layer)."""
    if not _fp8_token(weight):
        return None
    x2 = x.reshape(-1, x.shape[-1])
    if not gemm_skinny_fused_sm90.xn_takes(x2, norm_weight, weight.data):
        return None
    out = gemm_skinny_fused_sm90.xn_skinny_gemm_sm90(
        x2, norm_weight, eps, weight.data, weight.scale, bias, pdl_launch()
    )
    return out.view(*x.shape[:-1], out.shape[-1])


@register("linear", "triton_sm90", entry="residual_linear")
def residual_linear_sm90(
    x: torch.Tensor | QuantizedActivation, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None,
    residual: torch.Tensor,
) -> torch.Tensor | None:  # fmt: skip
    """residual += the layer's output (rounded to residual's dtype first, as the GEMM then the add round), in
    the skinny GEMM's epilogue, for FP8 W8A8 layers whose input came quantized per token or per 1 x 128 group
    (the attention or SiLU-mul kernel quantized it) at the sizes where norm_linear serves the next layer: residual,
    updated.
    None elsewhere (residual untouched; the caller runs the layer and adds)."""
    if not _fp8_token(weight) or not isinstance(x, QuantizedActivation) or x.scale.dim() != 2:
        return None
    a, b = x.data, weight.data
    m, n = a.shape[0], b.shape[0]
    if m > gemm_skinny_fused_sm90.XN_MAX_M or residual.shape != (m, n) or not residual.is_contiguous():
        return None
    if residual.dtype != x.dtype or not (gemm_skinny_sm90.takes(a, b) and gemm_skinny_sm90.measured_faster(
            m, n, a.shape[1], b.dtype)):  # fmt: skip
        return None
    return gemm_skinny_sm90.skinny_gemm_sm90(a, b, residual, bias, x.scale, weight.scale, pdl_launch(), add_c=True)


@register("linear", "triton_sm90", entry="gated_mlp_linear")
def gated_mlp_linear_sm90(
    x: torch.Tensor | QuantizedActivation, norm_weight: torch.Tensor | None, eps: float,
    gate_up: torch.Tensor | QuantizedWeight, gate_up_bias: torch.Tensor | None,
    down: torch.Tensor | QuantizedWeight, down_bias: torch.Tensor | None, residual: torch.Tensor | None,
) -> torch.Tensor | None:  # fmt: skip
    """down(silu(gate) * up of gate_up(x)) for FP8 per-token gate_up and down layers at M <= XN_MAX_M in two
    launches and no activation kernel: gate_up's skinny GEMM writes h = silu(gate) * up and its programs' block
    amaxes in its epilogue (GATED 3), and down's quantizes h per token itself from them (XQ). x: the input
    quantized per token; or, with norm_weight, the 16-bit residual stream, normalized in gate_up's GEMM (XN).
    residual: down's output added into it (ADD_C), and residual returned. None where the kernels do not serve
    (the caller runs the layers and the activation op)."""
    if not (_fp8_token(gate_up) and _fp8_token(down)):
        return None
    if norm_weight is None:
        if not isinstance(x, QuantizedActivation) or x.scale.dim() != 2 or x.grouped:
            return None
        a, a_scale, out_dtype = x.data, x.scale, x.dtype
    else:
        a, a_scale, out_dtype = x.reshape(-1, x.shape[-1]), None, x.dtype
    m, inter = a.shape[0], gate_up.data.shape[0] // 2
    if not gemm_skinny_fused_sm90.gated_amax_takes(a, gate_up.data, norm_weight):
        return None
    if down.data.shape[1] != inter or not gemm_skinny_fused_sm90.xq_takes(m, inter, out_dtype, down.data):
        return None
    if residual is not None and (residual.shape != (m, down.data.shape[0]) or residual.dtype != out_dtype
                                 or not residual.is_contiguous()):  # fmt: skip
        return None
    norm = (norm_weight, eps) if norm_weight is not None else None
    h, amax = gemm_skinny_fused_sm90.gated_amax_skinny_gemm_sm90(a, a_scale, gate_up.data, gate_up.scale, gate_up_bias,
                                                           out_dtype, pdl_launch(), norm)  # fmt: skip
    out = gemm_skinny_fused_sm90.xq_skinny_gemm_sm90(h, amax, down.data, down.scale, down_bias, pdl_launch(), residual)
    return out if residual is not None else out.view(*x.shape[:-1], out.shape[-1])
