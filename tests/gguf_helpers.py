"""GGUF fixtures: a tiny HF model written as llama.cpp's convert_hf_to_gguf.py writes it, quantized
per type, and the K-quant quantizers gguf-py lacks (it dequantizes Q2_K..Q6_K but cannot quantize
them). The K-quants here are plain round-to-nearest with each sub-block's min and max (llama.cpp's
own search for scales is better); they are checked against gguf's dequantize in the tests.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import transformers
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import load_file

from tritonllm.layers.rotary import rope_parameters

GGUF_ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
             "Qwen3ForCausalLM": "qwen3"}  # fmt: skip
K_QUANTS = (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)


def _round(x: np.ndarray) -> np.ndarray:
    return np.floor(x + 0.5)


def _fp16(x: np.ndarray) -> np.ndarray:
    """x as the fp16 it is stored as, back in float32."""
    return x.astype(np.float16).astype(np.float32)


def _scaled(x: np.ndarray, scale: np.ndarray, lo: int, hi: int, rounding=_round) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale[..., None] > 0, rounding(x / scale[..., None]), 0)
    return np.clip(q, lo, hi).astype(np.int32)


def _with_min(x: np.ndarray, qmax: int, scale_bits: int) -> tuple:
    """Asymmetric sub-blocks (w = d sc q - dmin m) of superblocks x [n, subs, size]: (d, dmin, sc, m,
    q, the values they stand for)."""
    lo, hi = np.minimum(x.min(-1), 0), x.max(-1)
    sub_scale, sub_min = (hi - lo) / qmax, -lo
    top = 2**scale_bits - 1
    d, dmin = _fp16(sub_scale.max(-1) / top), _fp16(sub_min.max(-1) / top)
    sc = _scaled(sub_scale, d, 0, top, np.ceil)  # rounded up: the scaled range covers the sub-block
    m = _scaled(sub_min, dmin, 0, top)
    q = _scaled(x + (dmin[:, None] * m)[..., None], d[:, None] * sc, 0, qmax)
    values = (d[:, None] * sc)[..., None] * q - (dmin[:, None] * m)[..., None]
    return d, dmin, sc, m, q, values


def _symmetric(x: np.ndarray, qmin: int, qmax: int, scale_bits: int) -> tuple:
    """Symmetric sub-blocks (w = d sc q, sc signed) of superblocks x [n, subs, size]: (d, sc, q, the
    values they stand for)."""
    sub_scale = np.abs(x).max(-1) / -qmin
    top = 2 ** (scale_bits - 1) - 1
    d = _fp16(sub_scale.max(-1) / top)
    sc = _scaled(sub_scale, d, -top - 1, top, np.ceil)
    q = _scaled(x, d[:, None] * sc, qmin, qmax)
    return d, sc, q, (d[:, None] * sc)[..., None] * q


def _half_bytes(d: np.ndarray) -> np.ndarray:
    return d.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _bits(q: np.ndarray, shift: int, width: int) -> np.ndarray:
    return ((q >> shift) & (2**width - 1)).astype(np.uint8)


def quantize_k(w: np.ndarray, qtype: Q) -> tuple[np.ndarray, np.ndarray]:
    """float32 [R, C] (C a multiple of 256) -> (the K-quant blocks, uint8 [R, C / 256 * type size],
    laid out as gguf-py's dequantize_blocks reads them; the float32 values they stand for)."""
    rows = w.shape[0]
    x = w.astype(np.float32).reshape(-1, 256)
    n = x.shape[0]
    if qtype in (Q.Q4_K, Q.Q5_K):
        d, dmin, sc, m, q, values = _with_min(x.reshape(n, 8, 32), 15 if qtype == Q.Q4_K else 31, 6)
        scales = np.zeros((n, 12), np.uint8)
        scales[:, 0:4] = sc[:, :4] | (_bits(sc[:, 4:], 4, 2) << 6)
        scales[:, 4:8] = m[:, :4] | (_bits(m[:, 4:], 4, 2) << 6)
        scales[:, 8:12] = _bits(sc[:, 4:], 0, 4) | (_bits(m[:, 4:], 0, 4) << 4)
        low = _bits(q, 0, 4).reshape(n, 4, 2, 32)  # byte 32c + l: sub-block 2c (low nibble), 2c + 1 (high)
        qs = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(n, 128)
        parts = [_half_bytes(d), _half_bytes(dmin), scales]
        if qtype == Q.Q5_K:  # bit i of qh[l]: the fifth bit of sub-block i's value l
            parts.append(sum(_bits(q[:, i], 4, 1) << i for i in range(8)).astype(np.uint8))
        blocks = np.concatenate([*parts, qs], axis=1)
    elif qtype == Q.Q2_K:
        d, dmin, sc, m, q, values = _with_min(x.reshape(n, 16, 16), 3, 4)
        crumbs = q.reshape(n, 2, 4, 32)  # byte 32c + l, bits 2s: value 128c + 32s + l
        qs = sum(crumbs[:, :, s] << (2 * s) for s in range(4)).astype(np.uint8).reshape(n, 64)
        blocks = np.concatenate([(sc | (m << 4)).astype(np.uint8), qs, _half_bytes(d), _half_bytes(dmin)], axis=1)
    elif qtype == Q.Q3_K:
        d, sc, q, values = _symmetric(x.reshape(n, 16, 16), -4, 3, 6)
        u = (q + 4).reshape(n, 256)
        hmask = sum(_bits(u.reshape(n, 8, 32)[:, s], 2, 1) << s for s in range(8)).astype(np.uint8)
        crumbs = _bits(u, 0, 2).reshape(n, 2, 4, 32)
        qs = sum(crumbs[:, :, s] << (2 * s) for s in range(4)).astype(np.uint8).reshape(n, 64)
        v = (sc + 32).astype(np.uint8)  # 6-bit: low nibbles of 0-7 / 8-15 in bytes 0-7, high crumbs in 8-11
        scales = np.concatenate(
            [_bits(v[:, :8], 0, 4) | (_bits(v[:, 8:], 0, 4) << 4),
             sum(_bits(v[:, 4 * t : 4 * t + 4], 4, 2) << (2 * t) for t in range(4)).astype(np.uint8)], axis=1,
        )  # fmt: skip
        blocks = np.concatenate([hmask, qs, scales, _half_bytes(d)], axis=1)
    elif qtype == Q.Q6_K:
        d, sc, q, values = _symmetric(x.reshape(n, 16, 16), -32, 31, 8)
        u = (q + 32).reshape(n, 2, 2, 64)  # ql byte 64c + l: value 128c + l (low), 128c + 64 + l (high)
        ql = (_bits(u[:, :, 0], 0, 4) | (_bits(u[:, :, 1], 0, 4) << 4)).reshape(n, 128)
        hi = u.reshape(n, 2, 4, 32)  # qh byte 32c + l, bits 2s: value 128c + 32s + l
        qh = sum(_bits(hi[:, :, s], 4, 2) << (2 * s) for s in range(4)).astype(np.uint8).reshape(n, 64)
        blocks = np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _half_bytes(d)], axis=1)
    else:
        raise ValueError(f"not a K-quant: {qtype.name}")
    return np.ascontiguousarray(blocks).reshape(rows, -1), values.reshape(w.shape)


def quantize(w: np.ndarray, qtype: Q) -> np.ndarray:
    """float32 [R, C] in a GGUF type: gguf-py's quantizer, or ours for the K-quants."""
    if qtype in K_QUANTS:
        return quantize_k(w, qtype)[0]
    return gguf.quants.quantize(w.astype(np.float32), qtype)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: each head's rotary halves interleaved into pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama3_freq_factors(rope: dict, head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf's rope_freqs for Llama 3.1 scaling."""
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * rope["rope_theta"] ** (i / head_dim)
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def _add_tokenizer(writer: gguf.GGUFWriter, folder: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    special = set(tokenizer.all_special_ids)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for _, i in vocab])
    gguf.SpecialVocab(folder, load_merges=True).add_to_gguf(writer, quiet=True)


def write_gguf(folder: str | Path, out: str | Path, qtype_of: Callable[[str], Q], permute: bool = True) -> Path:
    """Write the HF model in `folder` (config.json, model.safetensors) as a GGUF file at `out`:
    metadata and tensor names as convert_hf_to_gguf.py writes them, q/k rows permuted for llama
    (unless `permute` is False: a broken file for the test that the un-permutation matters),
    1-D tensors in F32 and each matrix in `qtype_of(its GGUF name)`."""
    folder, out = Path(folder), Path(out)
    config = json.loads((folder / "config.json").read_text())
    state = load_file(folder / "model.safetensors")
    arch = GGUF_ARCH[config["architectures"][0]]
    layers, heads, kv_heads = config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer = gguf.GGUFWriter(out, arch)
    writer.add_name(f"tiny-{config['model_type']}")  # transformers reads Mistral from a llama file's name
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    rope = rope_parameters(transformers.AutoConfig.from_pretrained(folder))
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    _add_tokenizer(writer, folder)
    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), layers)
    if rope["rope_type"] == "llama3":
        writer.add_tensor("rope_freqs.weight", _llama3_freq_factors(rope, head_dim))
    for hf_name, w in state.items():
        if hf_name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        base, suffix = hf_name.rsplit(".", 1)
        name = f"{names.get_name(base)}.{suffix}"
        if arch == "llama" and permute and (".q_proj." in hf_name or ".k_proj." in hf_name):
            w = _permute(w, heads if ".q_proj." in hf_name else kv_heads)
        qtype = qtype_of(name) if w.ndim == 2 else Q.F32
        if qtype == Q.F32:
            writer.add_tensor(name, w.astype(np.float32))
        elif qtype == Q.F16:
            writer.add_tensor(name, w.astype(np.float16))
        else:
            writer.add_tensor(name, quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
