"""Write a float HF folder's quantized copy in a published layout (test fixtures and benchmarks).

Layouts (quantization/config.py reads them back):
- fp8-block: `quant_method: fp8`, `weight_block_size: [128, 128]`, FP8 `weight` and float32
  `weight_scale_inv` per 128 x 128 block (Qwen3-FP8, DeepSeek-V3).
- fp8-tensor / fp8-tensor-static: `quant_method: fp8` with a per-tensor `weight_scale`, activations
  dynamic or static (`input_scale`, calibrated).
- ct-fp8-channel: compressed-tensors float-quantized, per-channel weights [N, 1], dynamic per-token
  activations (the "FP8-dynamic" recipe).
- ct-fp8-static: compressed-tensors float-quantized, per-tensor weights and static per-tensor
  activations, plus an FP8 kv_cache_scheme with per-layer `self_attn.k_scale` / `v_scale`.
- ct-int8-channel: compressed-tensors int-quantized W8A8 (per-channel int8 weights, dynamic
  per-token activations), with the all-zero `weight_zero_point` some exports carry.
- ct-int8-w8a16: compressed-tensors int-quantized, per-channel int8 weights, no activation
  quantization.
- gptq-g32-act-order / gptq-g128 / gptq-channel-v2: `quant_method: gptq`, 4-bit (quantization/gptq.py):
  128- or 32-column groups, the latter with act order (desc_act, a fixed permutation of K per
  layer input) and zero points in the original format (zero - 1); the last per-channel (group_size
  -1) with "gptq_v2" zero points.
- awq-g128: `quant_method: awq`, GEMM version, 4-bit with zero points per 128 columns (quantization/awq.py;
  round-to-nearest, without AWQ's activation-aware scale search).
- ct-w4a16-g64: compressed-tensors pack-quantized W4A16, symmetric int4 per 64 columns
  (quantization/ct_packed.py).
- gptq-8bit-g64-act-order: `quant_method: gptq`, 8-bit, 64-column groups, act order, original zeros.
- mxfp4: `quant_method: mxfp4` (gpt-oss): `weight_blocks` / `weight_scales` (quantization/mxfp4.py).
Static scales (input_scale, k/v scales) are calibrated on `calibration` prompts through HF
transformers' own model: amax / 448 of each layer's inputs (K/V: of k_proj / v_proj outputs).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

from tritonllm.kernels.quant_formats import QuantScheme
from tritonllm.quantization.awq import awq_tensors
from tritonllm.quantization.ct_packed import pack_quantized_tensors
from tritonllm.quantization.gptq import gptq_tensors
from tritonllm.quantization.mxfp4 import mxfp4_tensors
from tritonllm.quantization.quantize import quantize_weight

LAYOUTS = ("fp8-block", "fp8-tensor", "fp8-tensor-static", "ct-fp8-channel", "ct-fp8-static", "ct-int8-channel",
           "ct-int8-w8a16", "gptq-g32-act-order", "gptq-g128", "gptq-channel-v2", "awq-g128", "ct-w4a16-g64",
           "gptq-8bit-g64-act-order", "mxfp4")  # fmt: skip
# GPTQ layouts: (group_size, act order, checkpoint_format, bits)
_GPTQ = {
    "gptq-g32-act-order": (32, True, "gptq", 4),
    "gptq-g128": (128, False, "gptq", 4),
    "gptq-channel-v2": (-1, False, "gptq_v2", 4),
    "gptq-8bit-g64-act-order": (64, True, "gptq", 8),
}
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8 = torch.float8_e4m3fn  # checkpoints are published in e4m3fn (MI300 converts at load)


def _ct_args(kind: str, strategy: str, **extra: object) -> dict:
    return {"num_bits": 8, "type": kind, "strategy": strategy, "symmetric": True, "dynamic": False,
            "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax", **extra}  # fmt: skip


def _quantization_config(layout: str) -> dict:
    if layout == "ct-w4a16-g64":
        weights = dict(_ct_args("int", "group", group_size=64), num_bits=4)
        group = {"targets": ["Linear"], "weights": weights, "input_activations": None, "output_activations": None}
        return {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": group},
                "ignore": ["lm_head"], "quantization_status": "compressed"}  # fmt: skip
    if layout == "awq-g128":
        return {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
    if layout == "mxfp4":
        return {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head", "model.embed_tokens"]}
    if layout in _GPTQ:
        group, act_order, fmt, bits = _GPTQ[layout]
        return {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": act_order, "sym": False,
                "checkpoint_format": fmt, "lm_head": False}  # fmt: skip
    if layout.startswith("fp8-"):
        qc = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "static" if layout.endswith("static") else "dynamic",
        }
        if layout == "fp8-block":
            qc["weight_block_size"] = [128, 128]
        return qc
    kind = "float" if "fp8" in layout else "int"
    weights = _ct_args(kind, "tensor" if layout == "ct-fp8-static" else "channel")
    inputs = None
    if layout == "ct-fp8-static":
        inputs = _ct_args(kind, "tensor")
    elif layout != "ct-int8-w8a16":
        inputs = _ct_args(kind, "token", dynamic=True, observer=None)
    group = {"targets": ["Linear"], "weights": weights, "input_activations": inputs, "output_activations": None}
    kv = _ct_args("float", "tensor") if layout == "ct-fp8-static" else None
    return {"quant_method": "compressed-tensors", "format": "float-quantized" if kind == "float" else "int-quantized",
            "config_groups": {"group_0": group}, "ignore": ["lm_head"], "kv_cache_scheme": kv,
            "quantization_status": "compressed"}  # fmt: skip


@torch.no_grad()
def calibrate(folder: Path, prompts: list[list[int]]) -> dict[str, float]:
    """amax of every linear layer's input ("<module>.input") and of k_proj / v_proj outputs
    ("<module>.output") over `prompts`, run through HF transformers' model of the folder."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    amax: dict[str, float] = {}

    def hook(name: str):
        def record(_module, inputs, output) -> None:
            for key, t in ((f"{name}.input", inputs[0]), (f"{name}.output", output)):
                amax[key] = max(amax.get(key, 0.0), float(t.abs().max()))

        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n.endswith(_LINEARS)]
    for prompt in prompts:
        model(torch.tensor([prompt]))
    for h in handles:
        h.remove()
    return amax


def _quantize_tensor_wise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.float().abs().amax().clamp(min=1e-12) / torch.finfo(FP8).max
    return (w.float() / scale).clamp(-448, 448).to(FP8), scale.reshape(1)


def export_quantized(src: str | Path, dst: str | Path, layout: str, calibration: list[list[int]] | None = None) -> Path:
    """Write `src` (a float HF folder, single model.safetensors) quantized per `layout` to `dst`."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    static = layout.endswith("static")
    amax = calibrate(src, calibration or [list(range(10, 60))]) if static else {}
    fp8_max = float(torch.finfo(FP8).max)
    out: dict[str, torch.Tensor] = {}
    for name, t in load_file(src / "model.safetensors").items():
        module = name.removesuffix(".weight")
        if not (name.endswith(".weight") and module.endswith(_LINEARS)):
            out[name] = t
            continue
        if layout in _GPTQ:
            group, act_order, fmt, bits = _GPTQ[layout]
            k = t.shape[1]  # act order: a fixed permutation per input width (one per layer input, as GPTQ's)
            order = torch.randperm(k, generator=torch.Generator().manual_seed(k)) if act_order else None
            for suffix, tensor in gptq_tensors(t.float(), group, order, v1_zeros=fmt == "gptq", bits=bits).items():
                out[f"{module}.{suffix}"] = tensor
        elif layout == "mxfp4":
            for suffix, tensor in mxfp4_tensors(t.float()).items():
                out[f"{module}.{suffix}"] = tensor
        elif layout == "ct-w4a16-g64":
            for suffix, tensor in pack_quantized_tensors(t.float(), 64).items():
                out[f"{module}.{suffix}"] = tensor
        elif layout == "awq-g128":
            for suffix, tensor in awq_tensors(t.float(), 128).items():
                out[f"{module}.{suffix}"] = tensor
        elif layout == "fp8-block":
            q = quantize_weight(t, QuantScheme(FP8, "block", "group"))
            out[name], out[f"{module}.weight_scale_inv"] = q.data, q.scale
        elif layout in ("fp8-tensor", "fp8-tensor-static", "ct-fp8-static"):
            out[name], scale = _quantize_tensor_wise(t)
            out[f"{module}.weight_scale"] = scale.reshape(()) if layout.startswith("fp8-") else scale
        else:
            q = quantize_weight(t, QuantScheme(FP8 if "fp8" in layout else torch.int8, "channel", "token"))
            out[name], out[f"{module}.weight_scale"] = q.data, q.scale.reshape(-1, 1)
            if layout == "ct-int8-channel":
                out[f"{module}.weight_zero_point"] = torch.zeros(q.scale.shape[0], 1, dtype=torch.int8)
        if static:
            scale = torch.tensor(amax[f"{module}.input"] / fp8_max, dtype=torch.float32)
            out[f"{module}.input_scale"] = scale if layout.startswith("fp8-") else scale.reshape(1)
        if layout == "ct-fp8-static" and module.endswith(("k_proj", "v_proj")):
            attn = module.rsplit(".", 1)[0]
            out[f"{attn}.{module[-6]}_scale"] = torch.tensor(amax[f"{module}.output"] / fp8_max, dtype=torch.float32)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = _quantization_config(layout)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst
