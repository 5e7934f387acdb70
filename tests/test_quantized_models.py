"""Quantized checkpoints, loaded as published, against the same model unquantized.

The fixtures start from the tiny Llama fitted to a counting pattern (models/tiny.py: peaked
distributions, so quantization error shows as logprob differences instead of flipped near-ties),
write it in each published layout (quantization/export.py), and load it through the normal
loader. Each model's prompt logprobs are compared with the float model's: the mean and largest
absolute differences are reported and bounded, and greedy tokens must be equal.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tritonllm import LLM, SamplingParams
from tritonllm.models.tiny import fitted_tiny_model_path
from tritonllm.quantization.export import LAYOUTS, export_quantized

# a run of the pattern, a jump (an unlikely token: a large, sensitive logprob), the pattern again
PROMPTS = [list(range(100, 116)) + list(range(300, 310)), list(range(520, 530)) + list(range(40, 52))]
CALIBRATION = [list(range(10, 60)), list(range(200, 250)), list(range(550, 600))]
# mean / max |logprob difference| allowed per format (8-bit weights and activations, or 4-bit
# weights with 128-column groups, on a fitted model). The largest difference sits where the fitted
# model is unsure: the second token after the jump (float logprob about -4), where e4m3's 3 mantissa
# bits with one scale per channel and token moved it by 0.92 in the model fitted with transformers
# 5.25 / torch 2.13 (0.8 had been set on an earlier environment's fit; the mean stays at 0.03)
BOUNDS = {"int8": (0.02, 0.3), "fp8": (0.06, 1.2), "mxfp8": (0.08, 1.0), "int4": (0.15, 1.5), "mxfp4": (0.2, 2.0)}
KIND_OF_LAYOUT = {"gptq-8bit-g64-act-order": "int8", "mxfp4": "mxfp4"}


@pytest.fixture(scope="module")
def fitted() -> str:
    return str(fitted_tiny_model_path("LlamaForCausalLM"))


def _run(path: str, **kw) -> tuple[list[list[float]], list[list[int]]]:
    llm = LLM(model=path, max_model_len=128, max_num_seqs=4, **kw)
    # 3 tokens, as test_gguf.py: the prefill and two decode steps (the second reads K/V the first wrote);
    # under the interpreter each further decode step costs about 40% of the prefill
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    logprobs = [[pos[t].logprob for pos, t in zip(o.prompt_logprobs[1:], p[1:])] for o, p in zip(outputs, PROMPTS)]
    return logprobs, [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def float_run(fitted) -> tuple[list[list[float]], list[list[int]]]:
    return _run(fitted)


def _compare(name: str, got, want, bounds: tuple[float, float]) -> None:
    diffs = torch.tensor([abs(a - b) for g, w in zip(got[0], want[0]) for a, b in zip(g, w)])
    print(f"{name}: prompt logprobs vs float: mean |diff| {diffs.mean():.4f}, max {diffs.max():.4f}")
    assert got[1] == want[1], f"{name}: greedy tokens {got[1]} != float model's {want[1]}"
    assert diffs.mean() < bounds[0] and diffs.max() < bounds[1], (name, diffs.mean(), diffs.max())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_checkpoint_in_published_layout_tracks_the_float_model(layout, fitted, float_run, tmp_path) -> None:
    folder = export_quantized(fitted, tmp_path / layout, layout, CALIBRATION)
    got = _run(str(folder), kv_cache_dtype="fp8" if layout == "ct-fp8-static" else "auto")
    kind = KIND_OF_LAYOUT.get(layout) or (
        "int4" if layout.startswith(("gptq", "awq", "ct-w4")) else ("int8" if "int8" in layout else "fp8")
    )
    _compare(layout, got, float_run, BOUNDS[kind])


@pytest.mark.parametrize("method", ["fp8", "int8", "mxfp8", "int4", "mxfp4"])
def test_online_quantization_tracks_the_float_model(method, fitted, float_run) -> None:
    _compare(f"online {method}", _run(fitted, quantization=method), float_run, BOUNDS[method])


def test_quantized_layers_choose_a_kernel_that_serves_their_format(fitted, tmp_path) -> None:
    folder = export_quantized(fitted, tmp_path / "block", "fp8-block")
    llm = LLM(model=str(folder), max_model_len=64)
    assert llm.llm_engine.kernels.choice["linear"] == "triton"  # cuBLAS has no block-FP8 path
    layer = llm.llm_engine.model.model.layers[0].self_attn.qkv_proj
    assert layer.format_name == "fp8:block:group" and layer.qweight.data.dtype == torch.float8_e4m3fn
    with pytest.raises(
        ValueError, match=r"kernels.linear='torch' cannot run here: quantized format\(s\) \['fp8:block:group'\]"
    ):
        LLM(model=str(folder), max_model_len=64, kernels={"linear": "torch"})


def test_w8a8_layers_take_their_input_quantized_by_the_norm_and_activation_kernels(fitted, tmp_path) -> None:
    from tritonllm.kernels.quant_formats import QuantizedActivation

    llm = LLM(model=fitted, max_model_len=64, quantization="fp8")
    layer = llm.llm_engine.model.model.layers[0]
    assert layer.input_layernorm._quant_for == (layer.self_attn.qkv_proj,)
    assert layer.post_attention_layernorm._quant_for == (layer.mlp.gate_up_proj,)
    assert layer.mlp.act_fn._quant_for == (layer.mlp.down_proj,)
    x = torch.randn(3, layer.input_layernorm.weight.shape[0])
    out = layer.input_layernorm(x)
    assert isinstance(out, QuantizedActivation) and out.data.dtype == torch.float8_e4m3fn and out.scale.shape == (3, 1)
    # block-FP8: the norm and the activation quantize per 1 x 128 group (one scale a group of a row)
    block = LLM(model=str(export_quantized(fitted, tmp_path / "b", "fp8-block")), max_model_len=64)
    block_layer = block.llm_engine.model.model.layers[0]
    assert block_layer.mlp.act_fn._quant_for == (block_layer.mlp.down_proj,)
    out = block_layer.input_layernorm(x)
    assert isinstance(out, QuantizedActivation) and out.scale.shape == (3, -(-x.shape[1] // 128))
    # weight-only layers take their input as it is: nothing is fused
    w8a16 = LLM(model=str(export_quantized(fitted, tmp_path / "w", "ct-int8-w8a16")), max_model_len=64)
    assert w8a16.llm_engine.model.model.layers[0].mlp.act_fn._quant_for == ()


def test_split_kv_decode_quantizes_o_projs_input_in_the_attention_kernel(fitted, float_run, monkeypatch) -> None:
    """Decode steps on split-KV attention (a GPU of 64 SMs and 8-key splits pretended): the split kernel
    merges its results and quantizes o_proj's input itself (no merge kernel runs), and the FP8 model
    still tracks the float one within its bounds, as without the fusion."""
    import dataclasses

    from tritonllm.kernels import attention

    config = dataclasses.replace(attention.ATTENTION_CONFIGS["interpreter"], split_min_keys=8)
    monkeypatch.setattr(attention, "attention_config", lambda: config)
    monkeypatch.setattr(attention, "_num_multiprocessors", lambda: 64)
    merges = []
    merge = attention._MERGE
    monkeypatch.setattr(attention, "_MERGE", lambda *args, **kwargs: merges.append(1) or merge(*args, **kwargs))
    splits = []
    plan = attention.AttentionPlan.__init__
    monkeypatch.setattr(
        attention.AttentionPlan, "__init__", lambda self, *a, **k: plan(self, *a, **k) or splits.append(self.num_splits)
    )
    from tritonllm.kernels import gemm

    grouped = []  # per GEMM of an FP8 activation: whether its scales were 1 x 128 groups
    gemm_fn = gemm.gemm
    monkeypatch.setattr(gemm, "gemm", lambda a, *args, **kw: (a.dtype == torch.float8_e4m3fn and grouped.append(
        kw.get("a_scale_kind") == gemm.A_GROUP)) or gemm_fn(a, *args, **kw))  # fmt: skip
    fused = _run(fitted, quantization="fp8")
    assert max(splits) > 1 and not merges
    _compare("online fp8, attention epilogue fused", fused, float_run, BOUNDS["fp8"])
    # decode steps' o_proj took its input per 1 x 128 group (the linear implementation's input_quant); with
    # decode_group_quant off, per token only, and the model tracks the float one either way
    assert any(grouped)
    grouped.clear()
    per_token = _run(fitted, quantization="fp8", decode_group_quant=False)
    assert grouped and not any(grouped)
    _compare("online fp8, o_proj's input per token", per_token, float_run, BOUNDS["fp8"])


def test_online_quantization_frees_the_float_weights(fitted) -> None:
    llm = LLM(model=fitted, max_model_len=64, quantization="int8")
    layer = llm.llm_engine.model.model.layers[0].mlp.down_proj
    assert not hasattr(layer, "weight") and layer.qweight.data.dtype == torch.int8
    # lm_head stays in the model's dtype, as vLLM does
    assert llm.llm_engine.model.lm_head.weight.dtype == torch.float32


def _rewrite_config(folder, **quantization_config) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"].update(quantization_config)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "change, message",
    [
        (
            dict(quant_method="awq", bits=4, version="gemv"),
            "AWQ with bits=4, zero_point=True, version=.gemv. is not supported",
        ),
        (dict(quant_method="marlin"), "the checkpoint.s quant_method .marlin. is not supported"),
        (dict(quant_method="gptq", bits=3, group_size=128), "GPTQ with bits=3 is not supported"),
        (dict(quant_method="gptq", bits=4, group_size=128, lm_head=True), "quantized lm_head is not supported"),
        (dict(weight_block_size=[64, 64]), r"weight_block_size \[64, 64\] is not supported"),
        (dict(activation_scheme="weird"), "activation_scheme 'weird' is not supported"),
    ],
)
def test_unsupported_schemes_are_refused_by_name(change, message, fitted, tmp_path) -> None:
    folder = export_quantized(fitted, tmp_path / "q", "fp8-block")
    _rewrite_config(folder, **change)
    with pytest.raises(ValueError, match=message):
        LLM(model=str(folder), max_model_len=64)


def test_an_unsupported_compressed_tensors_strategy_is_refused_by_name(fitted, tmp_path) -> None:
    folder = export_quantized(fitted, tmp_path / "q", "ct-int8-channel")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "group"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match="compressed-tensors group 'group_0': weight strategy 'group' is not supported"
    ):
        LLM(model=str(folder), max_model_len=64)


def test_a_checkpoint_missing_a_scale_is_refused_naming_the_tensor(fitted, tmp_path) -> None:
    folder = export_quantized(fitted, tmp_path / "q", "ct-fp8-channel")
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight_scale"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing tensors \['model.layers.1.mlp.down_proj.weight_scale'\]"):
        LLM(model=str(folder), max_model_len=64)


def test_a_quantization_argument_that_contradicts_the_checkpoint_is_refused(fitted, tmp_path) -> None:
    folder = export_quantized(fitted, tmp_path / "q", "fp8-block")
    with pytest.raises(ValueError, match="the checkpoint is quantized with 'fp8'"):
        LLM(model=str(folder), max_model_len=64, quantization="int8")
    with pytest.raises(ValueError, match="quantization='fp4' is not supported"):
        LLM(model=fitted, max_model_len=64, quantization="fp4")


def test_checkpoint_kv_cache_scales_are_used_by_an_fp8_cache(fitted, tmp_path) -> None:
    folder = export_quantized(fitted, tmp_path / "q", "ct-fp8-static", CALIBRATION)
    stored = load_file(folder / "model.safetensors")["model.layers.0.self_attn.k_scale"]
    llm = LLM(model=str(folder), max_model_len=64, kv_cache_dtype="fp8")
    attn = llm.llm_engine.model.model.layers[0].self_attn.attn
    assert attn.k_scale.item() == pytest.approx(float(stored)) and attn.k_scale.item() != 1.0


def test_gptq_layer_shards_with_different_act_orders_are_refused(fitted, tmp_path) -> None:
    """q/k/v share their input, so GPTQ gives them one act order; a checkpoint whose shards differ
    is refused naming the tensor, and a truncated qweight names itself."""
    folder = export_quantized(fitted, tmp_path / "q", "gptq-g32-act-order")
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.g_idx"] = tensors["model.layers.0.self_attn.k_proj.g_idx"].flip(0)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"self_attn\.[qkv]_proj\.g_idx: .*different act orders"):
        LLM(model=str(folder), max_model_len=64)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.g_idx"] = tensors["model.layers.0.self_attn.q_proj.g_idx"].clone()
    tensors["model.layers.1.mlp.down_proj.qweight"] = tensors["model.layers.1.mlp.down_proj.qweight"][:-1]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"down_proj\.qweight: qweight: the checkpoint's shape \(63, 256\)"):
        LLM(model=str(folder), max_model_len=64)


@pytest.mark.parametrize("layout", ["gptq-g32-act-order", "gptq-channel-v2", "gptq-8bit-g64-act-order"])
def test_gptq_weights_dequantize_as_autogptq_defines_them(layout, fitted, tmp_path) -> None:
    """The loaded weight (unpacked, sorted by act order) dequantizes to what AutoGPTQ's formula reads
    from the published tensors: w[n, k] = (q[k, n] - (zero[g, n] + 1)) * scale[g, n] with g = g_idx[k]
    (no + 1 for gptq_v2), q and zero 32 / b b-bit fields an int32, lowest bits first (b = 4, 8)."""
    from tritonllm.kernels import reference

    folder = export_quantized(fitted, tmp_path / "q", layout)
    tensors = load_file(folder / "model.safetensors")
    prefix = "model.layers.1.mlp.down_proj"
    qweight, qzeros = tensors[f"{prefix}.qweight"].long(), tensors[f"{prefix}.qzeros"].long()
    scales, g_idx = tensors[f"{prefix}.scales"].float(), tensors[f"{prefix}.g_idx"].long()
    bits = 8 if "8bit" in layout else 4
    per, mask = 32 // bits, (1 << bits) - 1
    k, n = qweight.shape[0] * per, qweight.shape[1]
    ks, ns = torch.arange(k), torch.arange(n)
    q = (qweight[ks // per] >> (bits * (ks % per))[:, None]) & mask  # [K, N]
    zero = (qzeros[:, ns // per] >> (bits * (ns % per))[None, :]) & mask  # [G, N]
    zero = zero + (1 if layout != "gptq-channel-v2" else 0)
    expected = ((q - zero[g_idx]) * scales[g_idx]).T  # [N, K]
    llm = LLM(model=str(folder), max_model_len=64)
    layer = llm.llm_engine.model.model.layers[1].mlp.down_proj
    assert torch.equal(reference.dequantize_weight(layer.gptq).cpu(), expected)
    assert (layer.gptq.perm is not None) == layout.endswith("act-order")
    assert layer.gptq.scheme.format_name == ("uint8:group:none" if bits == 8 else "int4:group:none")


def test_mxfp4_weights_dequantize_as_gpt_oss_defines_them(fitted, tmp_path) -> None:
    """gpt-oss's MXFP4 (transformers' convert_moe_packed_tensors): byte j of block b of row n holds
    columns 32b + 2j (low nibble) and 32b + 2j + 1 (high), e2m1 codes into the table below, times
    2 ** (scales[n, b] - 127); modules_to_not_convert stay in the model's dtype."""
    from tritonllm.kernels import reference

    lut = torch.tensor([+0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    folder = export_quantized(fitted, tmp_path / "q", "mxfp4")
    tensors = load_file(folder / "model.safetensors")
    prefix = "model.layers.1.mlp.down_proj"
    blocks, scales = tensors[f"{prefix}.weight_blocks"].long(), tensors[f"{prefix}.weight_scales"].long()
    n = blocks.shape[0]
    values = torch.stack([lut[blocks & 0x0F], lut[blocks >> 4]], dim=-1).reshape(n, blocks.shape[1], 32)
    expected = torch.ldexp(values, scales[..., None] - 127).reshape(n, -1)
    float_tensors = load_file(f"{fitted}/model.safetensors")
    for name in [t for t in tensors if ".o_proj." in t]:  # o_proj kept in float, as the glob below says
        del tensors[name]
        tensors[name.rsplit(".", 1)[0] + ".weight"] = float_tensors[name.rsplit(".", 1)[0] + ".weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    _rewrite_config(folder, modules_to_not_convert=["lm_head", "model.layers.*.self_attn.o_proj"])
    llm = LLM(model=str(folder), max_model_len=64)
    layers = llm.llm_engine.model.model.layers
    assert torch.equal(reference.dequantize_weight(layers[1].mlp.down_proj.mxfp4).cpu(), expected)
    assert layers[0].self_attn.o_proj.format_name == "float" and layers[0].mlp.down_proj.format_name == "mxfp4:mx:none"


def test_awq_weights_dequantize_as_autoawq_defines_them(fitted, tmp_path) -> None:
    """AWQ's GEMM packing: bits 4i..4i+3 of qweight[k, c] hold output column 8c + (0, 2, 4, 6, 1, 3,
    5, 7)[i]; qzeros alike; w[n, k] = (q - zero) * scale of group k // G (zero points as stored)."""
    from tritonllm.kernels import reference

    folder = export_quantized(fitted, tmp_path / "q", "awq-g128")
    tensors = load_file(folder / "model.safetensors")
    prefix = "model.layers.0.self_attn.k_proj"
    qweight, qzeros = tensors[f"{prefix}.qweight"].long(), tensors[f"{prefix}.qzeros"].long()
    scales = tensors[f"{prefix}.scales"].float()
    k, n = qweight.shape[0], qweight.shape[1] * 8
    nibble = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])  # the nibble that holds column j of each eight
    ns = torch.arange(n)
    q = (qweight[:, ns // 8] >> (4 * nibble[ns % 8])[None, :]) & 15  # [K, N]
    zero = (qzeros[:, ns // 8] >> (4 * nibble[ns % 8])[None, :]) & 15  # [G, N]
    groups = torch.arange(k) // 128
    expected = ((q - zero[groups]) * scales[groups]).T
    llm = LLM(model=str(folder), max_model_len=64)
    qkv = llm.llm_engine.model.model.layers[0].self_attn.qkv_proj
    first, rows = qkv.shard_offsets["k"]
    assert torch.equal(reference.dequantize_weight(qkv.gptq)[first : first + rows].cpu(), expected)


def test_pack_quantized_weights_dequantize_as_compressed_tensors_defines_them(fitted, tmp_path) -> None:
    """pack-quantized: bits 4i..4i+3 of weight_packed[n, c] hold input column 8c + i, stored + 8;
    w[n, k] = (stored - 8) * weight_scale[n, k // G]; a wrong weight_shape is refused by name."""
    from tritonllm.kernels import reference

    folder = export_quantized(fitted, tmp_path / "q", "ct-w4a16-g64")
    tensors = load_file(folder / "model.safetensors")
    prefix = "model.layers.1.mlp.down_proj"
    packed, scale = tensors[f"{prefix}.weight_packed"].long(), tensors[f"{prefix}.weight_scale"].float()
    k = packed.shape[1] * 8
    ks = torch.arange(k)
    stored = (packed[:, ks // 8] >> (4 * (ks % 8))[None, :]) & 15  # [N, K]
    expected = (stored - 8) * scale[:, ks // 64]
    llm = LLM(model=str(folder), max_model_len=64)
    assert torch.equal(
        reference.dequantize_weight(llm.llm_engine.model.model.layers[1].mlp.down_proj.gptq).cpu(), expected
    )
    tensors[f"{prefix}.weight_shape"] = torch.tensor([7, 7])
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"down_proj\.weight_shape: weight_shape: \[7, 7\] is not this layer's"):
        LLM(model=str(folder), max_model_len=64)
