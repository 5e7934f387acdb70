"""GGUF files (loader/gguf_loader.py, quantization/gguf.py), written from the tiny models as llama.cpp's
converter writes them (tests/gguf_helpers.py: its tensor names, metadata, tokenizer and q/k row
permutation; gguf-py's quantizers, and round-to-nearest K-quants of our own).

- In F32 a GGUF file loads the same model as its HF folder, for every tiny architecture: names,
  q/k un-permutation, biases, q/k norms, tied embeddings, head_dim and RoPE (Llama 3.1's schedule
  through llama.cpp's rope_freqs) all come out right.
- Quantized, the fitted tiny Llama's prompt logprobs are compared with the float model's: mean and
  largest absolute differences reported and bounded, greedy tokens equal. Every matrix is quantized,
  embeddings and lm_head too (llama.cpp keeps those finer), so these bounds are on the harsh side.
- Malformed files are refused naming the tensor.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from gguf_helpers import K_QUANTS, quantize_k, write_gguf  # this folder (pytest puts it on sys.path)

from tritonllm import LLM, SamplingParams
from tritonllm.kernels import reference
from tritonllm.loader.gguf_loader import gguf_file
from tritonllm.loader.tokenizer import load_tokenizer
from tritonllm.models.loader import load_model
from tritonllm.models.tiny import TINY_ARCHITECTURES, fitted_tiny_model_path, tiny_model_path

PROMPTS = [list(range(100, 116)) + list(range(300, 310)), list(range(520, 530)) + list(range(40, 52))]
# the fitted Llama with every matrix in one type, or mixed as llama.cpp's Q4_K_M mixes them (and more):
# q/k/v Q4_K/Q3_K/Q6_K (fused into uint8, 16-column groups), o Q4_0 (int4, 32), gate/up Q4_K/Q2_K
# (int4, 16), down Q5_K (uint8, 32); layer 1's gate/up F16/Q8_0 (a float layer), embeddings Q4_K,
# lm_head Q6_K
MIXED = {"attn_q": Q.Q4_K, "attn_k": Q.Q3_K, "attn_v": Q.Q6_K, "attn_output": Q.Q4_0, "ffn_gate": Q.Q4_K,
         "ffn_up": Q.Q2_K, "ffn_down": Q.Q5_K, "blk.1.ffn_gate": Q.F16, "blk.1.ffn_up": Q.Q8_0,
         "token_embd": Q.Q4_K, "output": Q.Q6_K}  # fmt: skip
# mean / max |logprob difference| allowed, and the measured figures (2026-12-02, CPU)
BOUNDS = {
    "Q8_0": (0.02, 0.3),  # measured 0.0066 / 0.134
    "Q6_K": (0.04, 0.5),  # 0.0186 / 0.269
    "Q4_K": (0.15, 1.5),  # 0.0733 / 1.001
    "MXFP4": (0.2, 2.0),  # 0.1003 / 1.166
    "mixed": (0.25, 2.0),  # 0.1188 / 1.239
}


def _mixed(name: str) -> Q:
    for key in sorted(MIXED, key=len, reverse=True):  # the most specific key first
        if name.startswith(key + ".") or f".{key}." in name:
            return MIXED[key]
    raise KeyError(name)


def _qtype_of(kind: str):
    return _mixed if kind == "mixed" else (lambda name: Q[kind])


def _run(path: str) -> tuple[list[list[float]], list[list[int]]]:
    llm = LLM(model=path, max_model_len=128, max_num_seqs=4)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    logprobs = [[pos[t].logprob for pos, t in zip(o.prompt_logprobs[1:], p[1:])] for o, p in zip(outputs, PROMPTS)]
    return logprobs, [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def fitted() -> str:
    return str(fitted_tiny_model_path("LlamaForCausalLM"))


@pytest.fixture(scope="module")
def float_run(fitted):
    return _run(fitted)


# the largest rounding error of our K-quants relative to the largest weight (measured 0.243, 0.189,
# 0.048, 0.023, 0.022 on Gaussian weights): about half a step of a sub-block's range
K_QUANT_ERROR = {Q.Q2_K: 0.3, Q.Q3_K: 0.25, Q.Q4_K: 0.07, Q.Q5_K: 0.035, Q.Q6_K: 0.03}


@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda t: t.name)
def test_k_quant_fixtures_round_trip_through_gguf(qtype) -> None:
    """Our K-quant blocks dequantize (by gguf-py) to exactly the values we meant, near the input."""
    w = (np.random.default_rng(0).standard_normal((3, 512)) * 0.1).astype(np.float32)
    blocks, values = quantize_k(w, qtype)
    assert np.array_equal(dequantize(blocks, qtype), values)
    assert np.abs(values - w).max() < K_QUANT_ERROR[qtype] * np.abs(w).max()


@pytest.mark.parametrize("architecture", TINY_ARCHITECTURES)
def test_a_float_gguf_loads_the_same_model_as_its_hf_folder(architecture, tmp_path) -> None:
    folder = tiny_model_path(architecture)
    file = write_gguf(folder, tmp_path / "model.gguf", lambda name: Q.F32)
    want, want_config = load_model(folder, torch.float32, "cpu")
    got, config = load_model(file, torch.float32, "cpu")
    # (a llama file holds Mistral too: it loads as Llama, the same computation)
    assert type(got) is type(want) and config.head_dim == want_config.head_dim
    got_state, want_state = got.state_dict(), want.state_dict()
    assert got_state.keys() == want_state.keys()
    for name, tensor in want_state.items():  # RoPE tables (Llama 3.1's from rope_freqs) to rounding
        torch.testing.assert_close(got_state[name], tensor, rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_quantized_q_and_k_rows_come_back_in_hf_order(architecture, tmp_path) -> None:
    """llama.cpp permutes llama's q/k rows (not qwen's): the decoded fused weight is in HF's row order."""
    from safetensors.torch import load_file

    folder = tiny_model_path(architecture)
    model, _ = load_model(write_gguf(folder, tmp_path / "q8.gguf", lambda name: Q.Q8_0), torch.float32, "cpu")
    qkv = model.model.layers[0].self_attn.qkv_proj
    decoded = reference.dequantize_weight(qkv.gguf)
    hf = load_file(f"{folder}/model.safetensors")
    for shard, (first, rows) in qkv.shard_offsets.items():
        want = hf[f"model.layers.0.self_attn.{shard}_proj.weight"]
        torch.testing.assert_close(decoded[first : first + rows], want, rtol=0, atol=0.01 * float(want.abs().max()))


@pytest.mark.parametrize("kind", list(BOUNDS))
def test_a_quantized_gguf_tracks_the_float_model(kind, fitted, float_run, tmp_path) -> None:
    got = _run(str(write_gguf(fitted, tmp_path / "model.gguf", _qtype_of(kind))))
    diffs = torch.tensor([abs(a - b) for g, w in zip(got[0], float_run[0]) for a, b in zip(g, w)])
    print(f"GGUF {kind}: prompt logprobs vs float: mean |diff| {diffs.mean():.4f}, max {diffs.max():.4f}")
    assert got[1] == float_run[1], f"{kind}: greedy tokens {got[1]} != float model's {float_run[1]}"
    assert diffs.mean() < BOUNDS[kind][0] and diffs.max() < BOUNDS[kind][1], (kind, diffs.mean(), diffs.max())


def test_mixed_types_choose_layouts_per_layer(fitted, tmp_path) -> None:
    model, _ = load_model(write_gguf(fitted, tmp_path / "mixed.gguf", _mixed), torch.float32, "cpu")
    layer0, layer1 = model.model.layers
    formats = {
        "qkv": layer0.self_attn.qkv_proj.gguf.scheme,
        "o": layer0.self_attn.o_proj.gguf.scheme,
        "gate_up": layer0.mlp.gate_up_proj.gguf.scheme,
        "down": layer0.mlp.down_proj.gguf.scheme,
    }
    assert {k: (s.format_name, s.group_size) for k, s in formats.items()} == {
        "qkv": ("uint8:group:none", 16), "o": ("int4:group:none", 32),
        "gate_up": ("int4:group:none", 16), "down": ("uint8:group:none", 32),
    }  # fmt: skip
    assert layer1.mlp.gate_up_proj.format_name == "float" and layer1.mlp.gate_up_proj.weight.dtype == torch.float32


def test_the_tokenizer_comes_from_the_file_or_a_given_folder(tmp_path) -> None:
    # (the tiny tokenizer pre-tokenizes as GPT-2 does, which a llama file describes; transformers
    # reads a qwen2 file's tokenizer with Qwen2's split pattern, as real Qwen2 files need)
    folder = tiny_model_path("LlamaForCausalLM")
    write_gguf(folder, tmp_path / "model.gguf", lambda name: Q.F16)
    text = "The engine reads a request, splits the prompt 42."
    assert load_tokenizer(tmp_path).encode(text) == load_tokenizer(folder).encode(text)  # a folder with one .gguf
    llm = LLM(model=str(tmp_path / "model.gguf"), tokenizer=str(folder), max_model_len=64)
    assert llm.get_tokenizer().name_or_path == str(folder)
    out = llm.generate(text, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2
    assert llm.llm_engine.eos_token_ids == {2}
    (tmp_path / "copy.gguf").write_bytes((tmp_path / "model.gguf").read_bytes())
    with pytest.raises(ValueError, match="holds several GGUF files .copy.gguf, model.gguf.: pass the path of one"):
        gguf_file(tmp_path)


def _patch_tensor_info(file, name: str, qtype: int | None = None, dims: tuple[int, ...] | None = None) -> None:
    """Rewrite a tensor's type id or dims in the file's header (its info: name, n_dims u32, dims
    u64 each, type u32, offset u64)."""
    data = bytearray(file.read_bytes())
    at = data.index(name.encode()) + len(name)
    (n_dims,) = struct.unpack_from("<I", data, at)
    if dims is not None:
        struct.pack_into(f"<{n_dims}Q", data, at + 4, *dims)
    if qtype is not None:
        struct.pack_into("<I", data, at + 4 + 8 * n_dims, qtype)
    file.write_bytes(bytes(data))


def test_malformed_files_are_refused_naming_the_tensor(tmp_path) -> None:
    folder = tiny_model_path("Qwen3ForCausalLM")
    file = write_gguf(folder, tmp_path / "model.gguf", lambda name: Q.Q8_0)
    good = file.read_bytes()
    file.write_bytes(good[:-100])
    with pytest.raises(ValueError, match=r"GGUF tensor \S+: its data ends at byte [\d,]+ but the file has .*truncated"):
        LLM(model=str(file), max_model_len=64)
    file.write_bytes(good)
    _patch_tensor_info(file, "blk.0.attn_q.weight", qtype=int(Q.IQ2_XXS))  # fewer bytes than Q8_0: still readable
    with pytest.raises(ValueError, match="GGUF tensor blk.0.attn_q.weight: type IQ2_XXS is not supported"):
        LLM(model=str(file), max_model_len=64)
    file.write_bytes(good)
    _patch_tensor_info(file, "blk.0.attn_k.weight", qtype=99)
    with pytest.raises(ValueError, match="GGUF tensor blk.0.attn_k.weight: unknown type id 99"):
        LLM(model=str(file), max_model_len=64)
    file.write_bytes(good)
    _patch_tensor_info(file, "blk.1.ffn_down.weight", dims=(512, 224))
    with pytest.raises(
        ValueError, match=r"GGUF tensor blk.1.ffn_down.weight \(model.layers.1.mlp.down_proj.weight\) is \[224, 512\]"
    ):
        LLM(model=str(file), max_model_len=64)
    file.write_bytes(good)
    with pytest.raises(ValueError, match="quantization='int8' but the model is a GGUF file"):
        LLM(model=str(file), max_model_len=64, quantization="int8")
