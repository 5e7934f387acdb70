"""gpt-oss's MXFP4 experts as published (`*_blocks` / `*_scales`, gate and up rows interleaved,
quant_method "mxfp4" with modules_to_not_convert): the tiny gpt-oss's experts are quantized into that
layout, and the model loaded from it must give the logits of the same model whose experts hold the
dequantized values in float32 (so the layout, the de-interleaving and the MXFP4 MoE kernels are
exact), and stay close to the unquantized model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tritonllm.kernels.quant_formats import FP4, QuantizedWeight, QuantScheme
from tritonllm.kernels.reference import dequantize_weight
from tritonllm.kernels.registry import KernelContext, bind_kernels, select_kernels
from tritonllm.layers.attention import AttentionMetadata
from tritonllm.layers.moe import ROW_ALIGN, aligned_rows
from tritonllm.models.loader import layer_features, linear_formats, load_model
from tritonllm.models.tiny import tiny_model_path
from tritonllm.quantization.mxfp4 import mxfp4_tensors

MXFP4 = QuantScheme(FP4, "mx", "none")
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def _quantize_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """HF's stacked [E, K, N] (in x out) -> published blocks [E, N, K/32, 16], scales [E, N, K/32], and
    the float [E, K, N] they stand for."""
    blocks, scales, values = [], [], []
    for expert in w.transpose(1, 2):
        t = mxfp4_tensors(expert.contiguous())
        blocks.append(t["weight_blocks"])
        scales.append(t["weight_scales"])
        data = t["weight_blocks"].reshape(expert.shape[0], -1)
        values.append(dequantize_weight(QuantizedWeight(MXFP4, data, t["weight_scales"])))
    return torch.stack(blocks), torch.stack(scales), torch.stack(values).transpose(1, 2).contiguous()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple:
    """(the MXFP4 folder, the dequantized float folder, the original folder)."""
    source = tiny_model_path("GptOssForCausalLM")
    tensors = load_file(source / "model.safetensors")
    quantized, dequantized = dict(tensors), dict(tensors)
    for name in [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales, values = _quantize_experts(tensors[name])
        del quantized[name]
        quantized[f"{name}_blocks"], quantized[f"{name}_scales"] = blocks, scales
        dequantized[name] = values
    out = []
    for label, weights in (("mxfp4", quantized), ("dequantized", dequantized)):
        folder = tmp_path_factory.mktemp(label)
        for f in source.iterdir():
            if f.name != "model.safetensors":
                shutil.copy(f, folder / f.name)
        save_file(weights, folder / "model.safetensors")
        if label == "mxfp4":
            config = json.loads((folder / "config.json").read_text())
            config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED}
            (folder / "config.json").write_text(json.dumps(config))
        out.append(folder)
    return (*out, source)


def _log_probs(path, backend: str, quantization: str | None = None) -> torch.Tensor:
    model, config = load_model(path, torch.float32, "cpu", quantization)
    # as the engine selects: the model's quantized formats and attention features constrain "auto"
    context = KernelContext(
        "cpu", torch.float32, torch.float32, model.head_dim, linear_formats(model), layer_features(model)
    )
    bind_kernels(model, select_kernels(context=context, default=backend))
    n, block = 29, 16
    ids = torch.randint(0, config.vocab_size, (n,), generator=torch.Generator().manual_seed(0))
    blocks = -(-n // block)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n), block_tables=torch.arange(blocks, dtype=torch.int32)[None],
        seq_lens=torch.tensor([n], dtype=torch.int32), query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        max_query_len=n, max_seq_len=n,
    )  # fmt: skip
    shape = (blocks, block, model.num_kv_heads, model.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(model.num_layers)]
    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(n), caches, meta)).log_softmax(-1)


@pytest.mark.parametrize("backend", ["torch_ref", "auto"])
def test_mxfp4_experts_load_as_published_and_match_their_dequantized_values(folders, backend) -> None:
    mxfp4, dequantized, original = folders
    model, _ = load_model(mxfp4, torch.float32, "cpu")
    experts = model.model.layers[0].mlp.experts
    assert experts.scheme == MXFP4 and experts.w13.dtype == torch.uint8
    # w2's 48-byte rows (K = 96) are read from 64-byte-aligned rows (aligned_rows), w13's 128 as they are
    assert experts.w2.shape[-1] == 48 and experts.w2.stride(1) == ROW_ALIGN and experts.w13.is_contiguous()
    ours = _log_probs(mxfp4, backend)
    exact = _log_probs(dequantized, "torch_ref")
    assert (ours - exact).abs().max() < 1e-4
    drift = (ours - _log_probs(original, "torch_ref")).abs().mean()
    print(f"MXFP4 experts vs the unquantized tiny gpt-oss: mean |d logprob| {drift:.4f}")
    assert 0 < drift < 1.0  # random weights (flat distributions): 0.57 measured; the exact check is above


def test_swapped_gate_and_up_rows_are_caught(folders, tmp_path) -> None:
    """The de-interleaving matters: a checkpoint whose gate/up rows are not interleaved gives other logits."""
    mxfp4, dequantized, _ = folders
    tensors = load_file(mxfp4 / "model.safetensors")
    for name in [k for k in tensors if "gate_up_proj_" in k and not k.endswith("_bias")]:
        t = tensors[name]
        tensors[name] = torch.cat([t[:, 0::2], t[:, 1::2]], dim=1).contiguous()
    for f in mxfp4.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, tmp_path / f.name)
    save_file(tensors, tmp_path / "model.safetensors")
    assert (_log_probs(tmp_path, "torch_ref") - _log_probs(dequantized, "torch_ref")).abs().max() > 1e-2


def test_aligned_rows_keep_the_values_and_align_each_row() -> None:
    t = torch.randint(0, 256, (3, 5, 40), dtype=torch.uint8)
    a = aligned_rows(t)
    assert torch.equal(a, t) and a.stride() == (5 * 64, 64, 1) and a.view(torch.int32).shape == (3, 5, 10)
    assert torch.equal(a.view(torch.int32), t.view(torch.int32))  # the GEMV's word view reads the same bytes
    assert aligned_rows(a) is a  # already aligned: as it is
    full = torch.zeros(2, 3, 64, dtype=torch.uint8)
    assert aligned_rows(full) is full
