"""Which linear layers are quantized, and how: from the checkpoint's `quantization_config` (as
published) or from `quantization=` (online quantization of a float checkpoint).

Read as published:
- `quant_method: "fp8"` (Qwen3-FP8, DeepSeek-V3, vLLM's own FP8 exports): FP8 e4m3 `weight`; with
  `weight_block_size: [128, 128]` a float32 `weight_scale_inv` per 128 x 128 block and activations
  quantized per 1 x 128 group at run time; without it a per-tensor `weight_scale`, and
  `activation_scheme` "dynamic" (per-token scales at run time) or "static" (`input_scale`).
  `ignored_layers` / `modules_to_not_convert` stay unquantized.
- `quant_method: "compressed-tensors"` with format `float-quantized` (FP8), `int-quantized` or
  `naive-quantized` (INT8): `config_groups` whose `weights` are 8-bit symmetric with strategy
  tensor, channel or block, and whose `input_activations` are dynamic per token, static per tensor
  (`input_scale`) or absent (weight-only W8A16); `ignore` lists names or "re:" patterns.
- `quant_method: "gptq"`: 4- and 8-bit GPTQ (quantization/gptq.py), groups, act order, both zero formats.
- `quant_method: "mxfp4"` (gpt-oss): OCP MXFP4 weights stored as `<tensor>_blocks` (uint8, two e2m1
  values a byte along K, the first in the low nibble) and `<tensor>_scales` (e8m0 per 32 columns);
  `modules_to_not_convert` (glob patterns) stay unquantized (quantization/mxfp4.py).
- `quant_method: "awq"`: 4-bit AWQ, GEMM version (quantization/awq.py).
- compressed-tensors `pack-quantized`: W4A16, 4-bit symmetric per group or channel, act order or not
  (quantization/ct_packed.py).
Anything else (3-bit GPTQ, other AWQ versions, other 4-bit formats, asymmetric 8-bit, other
strategies) is refused at load, by name.

Online: `quantization="fp8"` (per-channel weights, per-token activations), `"int8"` (same, int8),
`"mxfp8"` (OCP MX on both operands), `"int4"` (weight-only W4A16: asymmetric int4 per 128
columns, packed two a byte) or `"mxfp4"` (weight-only: e2m1 pairs with e8m0 scales per 32 columns);
lm_head stays in the model's dtype, as vLLM does.
GPUs without FP8 (NVIDIA before compute capability 8.9) run FP8 checkpoints weight-only: the GEMM
decodes the e4m3 bytes and multiplies in the activations' dtype (logged).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from tritonllm import platform
from tritonllm.kernels.quant_formats import BLOCK, FP4, INT4, UINT8, QuantScheme

logger = logging.getLogger(__name__)

ONLINE_METHODS = ("fp8", "int8", "mxfp8", "int4", "mxfp4")
INT4_GROUP = 128  # online int4: asymmetric, one scale and zero point per 128 columns
CHECKPOINT_METHODS = ("fp8", "compressed-tensors", "gptq", "awq", "mxfp4")


@dataclass(frozen=True)
class LayerQuant:
    """How one linear layer is stored and run."""

    scheme: QuantScheme
    online: bool  # quantized at load from the checkpoint's float weight
    scale_name: str = "weight_scale"  # the checkpoint's tensor of weight scales ("weight_scale_inv": block FP8)
    static_input: bool = False  # the checkpoint carries `input_scale` (act "tensor")
    checkpoint_dtype: torch.dtype | None = None  # the weight's dtype on disk (e4m3fn on MI300: converted)
    zero_offset: int = 0  # GPTQ: added to the stored zero points (1 in the original format, which stores zero - 1)
    # grouped-integer checkpoints: "gptq", "awq", "ct" or "ct-g_idx" (compressed-tensors pack-quantized);
    # "mxfp4": gpt-oss's *_blocks / *_scales; "gguf": llama.cpp blocks (quantization/gguf.py)
    packing: str = ""


@dataclass
class QuantConfig:
    method: str  # "fp8", "compressed-tensors", or "online-<fp8|int8|mxfp8>"
    default: LayerQuant | None  # the layers not matched by `targets`
    targets: list[tuple[re.Pattern, LayerQuant]] = field(default_factory=list)  # first match wins
    ignore: list[re.Pattern] = field(default_factory=list)  # unquantized layers

    def for_layer(self, prefix: str) -> LayerQuant | None:
        """The quantization of the linear layer at HF module path `prefix` (e.g.
        "model.layers.0.self_attn.q_proj"), or None for an unquantized one."""
        # an ignored module covers its children (gpt-oss ignores "model.layers.*.self_attn")
        parts = prefix.split(".")
        scopes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)] + [parts[-1]]
        if any(p.fullmatch(scope) for p in self.ignore for scope in scopes):
            return None
        for pattern, layer in self.targets:
            if pattern.fullmatch(prefix):
                return layer
        return self.default

    def describe(self) -> str:
        first = self.default or (self.targets[0][1] if self.targets else None)
        return f"{self.method} ({first.scheme.format_name if first else 'no quantized layers'})"


def _fp8() -> torch.dtype:
    """The FP8 flavour the kernels compute in: e4m3fnuz on MI300, else e4m3fn (also the storage
    of weight-only FP8 on GPUs without FP8, whose GEMM decodes the bytes)."""
    return platform.fp8_e4m3_dtype() if platform.has_fp8() and platform.is_gpu() else torch.float8_e4m3fn


def _act_on_this_gpu(act: str, what: str) -> str:
    """The activation scheme to run: weight-only where the GPU has no FP8 (chosen explicitly, logged)."""
    if act == "none" or platform.has_fp8():
        return act
    logger.warning("%s: this GPU has no FP8 tensor cores, so FP8 weights run weight-only (W8A16)", what)
    return "none"


def _names(patterns: list[str] | None, globs: bool = False) -> list[re.Pattern]:
    """HF ignore lists: exact module names, "re:" regular expressions (compressed-tensors), or with
    `globs` names where `*` stands for any run of characters (gpt-oss's modules_to_not_convert)."""
    out = []
    for p in patterns or []:
        if p.startswith("re:"):
            out.append(re.compile(p[3:]))
        else:
            out.append(re.compile(".*".join(map(re.escape, p.split("*"))) if globs else re.escape(p)))
    return out


def _fp8_method(qc: dict[str, Any]) -> QuantConfig:
    block = qc.get("weight_block_size")
    activation = qc.get("activation_scheme", "dynamic")
    if activation not in ("dynamic", "static"):
        raise ValueError(f"quant_method 'fp8': activation_scheme {activation!r} is not supported (dynamic, static)")
    if block is not None:
        if list(block) != [BLOCK, BLOCK]:
            raise ValueError(f"quant_method 'fp8': weight_block_size {block} is not supported (only [128, 128])")
        if activation != "dynamic":
            raise ValueError("quant_method 'fp8' with weight_block_size needs activation_scheme 'dynamic'")
        act = _act_on_this_gpu("group", "block-FP8 checkpoint")
        layer = LayerQuant(
            QuantScheme(_fp8(), "block", act), False, "weight_scale_inv", checkpoint_dtype=torch.float8_e4m3fn
        )
    else:
        act = _act_on_this_gpu("token" if activation == "dynamic" else "tensor", "FP8 checkpoint")
        layer = LayerQuant(QuantScheme(_fp8(), "channel", act), False, "weight_scale", activation == "static",
                           checkpoint_dtype=torch.float8_e4m3fn)  # fmt: skip
    ignore = _names(qc.get("ignored_layers") or qc.get("modules_to_not_convert"))
    return QuantConfig("fp8", layer, ignore=ignore)


def _compressed_tensors_group(name: str, group: dict[str, Any], fmt: str) -> LayerQuant:
    weights, inputs = group.get("weights") or {}, group.get("input_activations")
    where = f"compressed-tensors group {name!r}"
    if weights.get("num_bits") != 8 or not weights.get("symmetric", True) or weights.get("dynamic", False):
        raise ValueError(
            f"{where}: weights {weights} are not supported (8-bit symmetric static weights in this format; 4-bit W4A16: format pack-quantized)"
        )
    kind, strategy = weights.get("type", "int"), weights.get("strategy")
    if kind not in ("float", "int") or (kind == "float") != (fmt == "float-quantized"):
        raise ValueError(f"{where}: weight type {kind!r} does not fit format {fmt!r}")
    dtype = _fp8() if kind == "float" else torch.int8
    checkpoint_dtype = torch.float8_e4m3fn if kind == "float" else torch.int8
    if strategy == "block":
        if list(weights.get("block_structure") or []) != [BLOCK, BLOCK]:
            raise ValueError(
                f"{where}: block_structure {weights.get('block_structure')} is not supported (only [128, 128])"
            )
        weight_scale = "block"
    elif strategy in ("tensor", "channel"):
        weight_scale = "channel"  # a per-tensor scale is stored expanded per channel
    else:
        raise ValueError(f"{where}: weight strategy {strategy!r} is not supported (tensor, channel, block)")
    if inputs is None:
        act = "none"
    else:
        if inputs.get("num_bits") != 8 or inputs.get("type", kind) != kind or not inputs.get("symmetric", True):
            raise ValueError(
                f"{where}: input_activations {inputs} are not supported (8-bit symmetric, same type as weights)"
            )
        i_strategy, dynamic = inputs.get("strategy"), inputs.get("dynamic", True)
        if dynamic and i_strategy == "token" and weight_scale == "channel":
            act = "token"
        elif not dynamic and i_strategy == "tensor" and weight_scale == "channel":
            act = "tensor"
        elif dynamic and i_strategy == "group" and inputs.get("group_size") == BLOCK and weight_scale == "block":
            act = "group"
        else:
            raise ValueError(
                f"{where}: input_activations strategy {i_strategy!r} dynamic={dynamic} with {strategy} weights is not supported"
            )
    if dtype != torch.int8:
        act = _act_on_this_gpu(act, where)
    return LayerQuant(QuantScheme(dtype, weight_scale, act), False, "weight_scale", act == "tensor", checkpoint_dtype)


def _compressed_tensors_packed_group(name: str, group: dict[str, Any]) -> LayerQuant:
    """pack-quantized (quantization/ct_packed.py): 4-bit symmetric int weights per group or channel,
    no activation quantization (W4A16), act order or not."""
    weights = group.get("weights") or {}
    ok = (weights.get("num_bits") == 4 and weights.get("type", "int") == "int" and weights.get("symmetric", True)
          and not weights.get("dynamic", False) and weights.get("strategy") in ("group", "channel")
          and weights.get("actorder") in (None, "weight", "group") and group.get("input_activations") is None)  # fmt: skip
    if not ok:
        raise ValueError(
            f"compressed-tensors group {name!r}: pack-quantized weights {weights} with input_activations "
            f"{group.get('input_activations')} are not supported (4-bit symmetric int, group or channel, W4A16)"
        )
    size = weights.get("group_size") if weights["strategy"] == "group" else -1
    packing = "ct-g_idx" if weights.get("actorder") == "group" else "ct"
    return LayerQuant(QuantScheme(INT4, "group", "none", group_size=size), False, packing=packing)


def _compressed_tensors_method(qc: dict[str, Any]) -> QuantConfig:
    fmt = qc.get("format")
    formats = ("float-quantized", "int-quantized", "naive-quantized", "pack-quantized")
    if fmt not in formats:
        raise ValueError(f"compressed-tensors format {fmt!r} is not supported ({', '.join(formats)})")
    config = QuantConfig("compressed-tensors", None, ignore=_names(qc.get("ignore")))
    for name, group in (qc.get("config_groups") or {}).items():
        if fmt == "pack-quantized":
            layer = _compressed_tensors_packed_group(name, group)
        else:
            layer = _compressed_tensors_group(name, group, fmt)
        for target in group.get("targets", []):
            if target == "Linear":
                config.default = layer
            else:
                config.targets.append((_names([target])[0], layer))
    kv = qc.get("kv_cache_scheme")
    if kv is not None:
        # its per-layer k_scale / v_scale tensors are read by name (models/llama.py) for an FP8 cache
        if kv.get("num_bits") != 8 or kv.get("type") != "float" or kv.get("strategy") != "tensor":
            raise ValueError(f"compressed-tensors kv_cache_scheme {kv} is not supported (8-bit float per tensor)")
    return config


def _gptq_method(qc: dict) -> QuantConfig:
    """GPTQ (quantization/gptq.py): 4- or 8-bit, any group size (-1: one group per row), act order
    or not, symmetric or not, zero points in the original (zero - 1) or the v2 format."""
    bits, group = qc.get("bits"), qc.get("group_size", 128)
    if bits not in (4, 8):
        raise ValueError(f"GPTQ with bits={bits} is not supported (4- and 8-bit GPTQ are)")
    if not (group == -1 or (isinstance(group, int) and group > 0 and group % 2 == 0)):
        raise ValueError(f"GPTQ group_size={group} is not supported (-1 or a positive even number)")
    if qc.get("lm_head"):
        raise ValueError("GPTQ with a quantized lm_head is not supported")
    fmt = qc.get("checkpoint_format", "gptq")
    if fmt not in ("gptq", "gptq_v2"):
        raise ValueError(f"GPTQ checkpoint_format {fmt!r} is not supported ('gptq', 'gptq_v2')")
    scheme = QuantScheme(INT4 if bits == 4 else UINT8, "group", "none", group_size=group)
    layer = LayerQuant(scheme, False, zero_offset=1 if fmt == "gptq" else 0, packing="gptq")
    skipped = qc.get("modules_to_not_convert") or []
    return QuantConfig("gptq", layer, ignore=_names(["lm_head", *skipped]))


def _awq_method(qc: dict) -> QuantConfig:
    """AWQ, GEMM version (quantization/awq.py): 4-bit with zero points, any group size."""
    bits, version = qc.get("bits", qc.get("w_bit")), qc.get("version", "gemm")
    group = qc.get("group_size", qc.get("q_group_size", 128))
    if bits != 4 or not qc.get("zero_point", True) or str(version).lower() != "gemm":
        raise ValueError(
            f"AWQ with bits={bits}, zero_point={qc.get('zero_point', True)}, version={version!r} is not supported "
            "(4-bit GEMM version with zero points is)"
        )
    if not (isinstance(group, int) and (group == -1 or (group > 0 and group % 2 == 0))):
        raise ValueError(f"AWQ group_size={group} is not supported (-1 or a positive even number)")
    scheme = QuantScheme(INT4, "group", "none", group_size=group)
    skipped = qc.get("modules_to_not_convert") or []
    return QuantConfig("awq", LayerQuant(scheme, False, packing="awq"), ignore=_names(["lm_head", *skipped]))


def _mxfp4_method(qc: dict) -> QuantConfig:
    """gpt-oss's MXFP4 (quantization/mxfp4.py): every linear layer not in modules_to_not_convert."""
    layer = LayerQuant(QuantScheme(FP4, "mx", "none"), False, packing="mxfp4")
    return QuantConfig(
        "mxfp4", layer, ignore=_names(["lm_head", *(qc.get("modules_to_not_convert") or [])], globs=True)
    )


def _online_method(method: str) -> QuantConfig:
    if method == "int8":
        scheme = QuantScheme(torch.int8, "channel", "token")
    elif method == "int4":
        scheme = QuantScheme(INT4, "group", "none", group_size=INT4_GROUP)
    elif method == "mxfp4":
        scheme = QuantScheme(FP4, "mx", "none")
    elif method == "fp8":
        scheme = QuantScheme(_fp8(), "channel", _act_on_this_gpu("token", "quantization='fp8'"))
    else:
        if not platform.has_fp8():
            raise ValueError("quantization='mxfp8' needs FP8 support (NVIDIA compute capability 8.9+, AMD MI300)")
        scheme = QuantScheme(_fp8(), "mx", "mx")
    return QuantConfig(f"online-{method}", LayerQuant(scheme, True), ignore=_names(["lm_head"]))


def quant_config(hf_config: Any, quantization: str | None) -> QuantConfig | None:
    """The model's QuantConfig: from `quantization_config` in config.json, or online from
    `quantization`; None when neither asks for one. Unsupported schemes raise ValueError by name."""
    qc = getattr(hf_config, "quantization_config", None)
    if qc is not None and not isinstance(qc, dict):
        qc = qc.to_dict()
    if qc:
        method = qc.get("quant_method")
        if quantization is not None and quantization != method:
            raise ValueError(
                f"quantization={quantization!r} but the checkpoint is quantized with {method!r}: leave quantization unset"
            )
        if method == "fp8":
            return _fp8_method(qc)
        if method == "compressed-tensors":
            return _compressed_tensors_method(qc)
        if method == "gptq":
            return _gptq_method(qc)
        if method == "awq":
            return _awq_method(qc)
        if method == "mxfp4":
            return _mxfp4_method(qc)
        raise ValueError(
            f"the checkpoint's quant_method {method!r} is not supported (supported: {', '.join(CHECKPOINT_METHODS)})"
        )
    if quantization is None:
        return None
    if quantization not in ONLINE_METHODS:
        raise ValueError(
            f"quantization={quantization!r} is not supported: online quantization is one of {list(ONLINE_METHODS)}, "
            f"quantized checkpoints are read from their config.json ({', '.join(CHECKPOINT_METHODS)})"
        )
    return _online_method(quantization)
