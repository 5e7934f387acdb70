"""GGUF checkpoints (llama.cpp's single-file format), read with the `gguf` package.

`LLM(model="model.gguf")`, or a folder holding exactly one .gguf file and no config.json, serves
GGUF architectures llama (Llama and Mistral), qwen2 and qwen3:
- config: transformers' GGUF support (AutoConfig with `gguf_file`), completed with what it leaves
  out: head_dim (`attention.key_length`), the architecture's class name, llama.cpp's `rope_freqs`
  tensor (how its converter stores Llama 3.1's RoPE schedule: per-frequency divisors), and no
  sliding window for llama (llama.cpp applies none there). Other RoPE scalings are refused;
- names: transformers' GGUF-to-HF map (gguf-py's TensorNameMap over the names of the HF model,
  built on the meta device), whose shapes check every tensor before any is read;
- llama.cpp's converter permutes the q/k rows of llama models (its RoPE rotates adjacent pairs);
  GGUF blocks run along rows, so the permutation is undone by reordering rows: of the float
  tensor, or of the block bytes before they are decoded;
- quantized linear weights reach their layers as stored (quantization/gguf.py decodes them into
  the quantized GEMMs' layouts); quantized embeddings, lm_head (`output`) and any other quantized
  tensor are dequantized to the model's dtype in Triton (kernels/gguf_dequant.py); F32, F16 and
  BF16 tensors are cast.
A malformed file (tensor data past the end of the file, a type id gguf does not know, a type
tritonllm does not decode, a shape that does not fit the config) is refused naming the tensor.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, ReaderTensor
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from tritonllm.kernels.gguf_dequant import dequantize_gguf
from tritonllm.layers.rotary import rope_parameters
from tritonllm.models.llama import fused_module_name
from tritonllm.quantization.config import QuantConfig
from tritonllm.quantization.gguf import FLOAT_TYPES, SUPPORTED_TYPES, GGUFWeight, layer_quant_for

# GGUF architecture -> the HF class per transformers' model_type (llama.cpp writes Mistral as llama)
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")
HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
ROPE_FREQS = "rope_freqs.weight"


def gguf_file(path: str | Path) -> Path | None:
    """The GGUF file `path` names: itself (a .gguf file), or the one .gguf in a folder without
    config.json; None for anything else (an HF folder)."""
    p = Path(path)
    if p.is_file() and p.suffix == ".gguf":
        return p
    if p.is_dir() and not (p / "config.json").is_file():
        files = sorted(p.glob("*.gguf"))
        if len(files) > 1:
            raise ValueError(
                f"model folder {str(p)!r} holds several GGUF files ({', '.join(f.name for f in files)}): pass the "
                "path of one (split GGUF files are not supported: merge them with llama.cpp's llama-gguf-split)"
            )
        return files[0] if files else None
    return None


class _CheckedReader(GGUFReader):
    """gguf's reader, refusing by name a tensor whose type id gguf does not know or whose data runs
    past the end of the file (gguf itself fails on these without naming the tensor)."""

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        for field in fields:
            _, name_data, _, dims, raw_dtype, offset = field.parts
            name = bytes(name_data).decode("utf-8", "replace")
            try:
                qtype = GGMLQuantizationType(int(raw_dtype[0]))
            except ValueError:
                raise ValueError(
                    f"GGUF tensor {name}: unknown type id {int(raw_dtype[0])}: the file was written by a newer "
                    "llama.cpp than the installed gguf package reads; upgrade gguf or requantize the model"
                ) from None
            block, type_size = GGML_QUANT_SIZES[qtype]
            if int(dims[0]) % block:
                raise ValueError(f"GGUF tensor {name}: rows of {int(dims[0])} values do not fill {qtype.name} blocks")
            end = start_offs + int(offset[0]) + int(np.prod(dims)) // block * type_size
            if end > len(self.data):
                raise ValueError(
                    f"GGUF tensor {name}: its data ends at byte {end:,} but the file has {len(self.data):,}: "
                    "the file is truncated; download or convert it again"
                )
        super()._build_tensors(start_offs, fields)


def _field(reader: GGUFReader, key: str) -> Any:
    field = reader.get_field(key)
    return None if field is None else field.contents()


class GGUFCheckpoint:
    """A GGUF file's config, tensors (checked against the config) and the layout of its linear layers."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.reader = _CheckedReader(file)
        self.arch = _field(self.reader, "general.architecture")
        if self.arch not in GGUF_ARCHITECTURES:
            raise ValueError(
                f"{file.name}: GGUF architecture {self.arch!r} is not supported (supported: {', '.join(GGUF_ARCHITECTURES)})"
            )
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.config = self._config()
        self.hf_names, self.hf_shapes, linear = self._hf_names()
        for tensor in self.reader.tensors:
            self._check(tensor)
        self._plan_linear_layers(linear)

    def _config(self) -> PretrainedConfig:
        config = AutoConfig.from_pretrained(self.file.parent, gguf_file=self.file.name, local_files_only=True)
        config.architectures = [HF_ARCHITECTURES[config.model_type]]
        key_length = _field(self.reader, f"{self.arch}.attention.key_length")
        if key_length is not None:
            config.head_dim = int(key_length)
        if self.arch == "llama":
            config.sliding_window = None
        scaling = _field(self.reader, f"{self.arch}.rope.scaling.type")
        if scaling not in (None, "none"):
            raise ValueError(f"{self.file.name}: RoPE scaling {scaling!r} (GGUF metadata) is not supported")
        if ROPE_FREQS in self.tensors:  # divisors of each inverse frequency (llama.cpp's Llama 3.1 RoPE)
            factors = self.tensors[ROPE_FREQS].data.astype(np.float32).reshape(-1).tolist()
            config.rope_parameters = {**rope_parameters(config), "freq_factors": factors}
        for token in ("bos", "eos", "pad"):
            token_id = _field(self.reader, f"tokenizer.ggml.{token}_token_id")
            if token_id is not None and getattr(config, f"{token}_token_id", None) is None:
                setattr(config, f"{token}_token_id", int(token_id))
        return config

    def _hf_names(self) -> tuple[dict[str, str], dict[str, tuple[int, ...]], set[str]]:
        """(GGUF name -> HF name, HF name -> shape, the HF names of linear layers' weights) from the HF
        model of this config, built on the meta device (no memory)."""
        from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

        with torch.device("meta"):
            hf_model = AutoModelForCausalLM.from_config(self.config)
        names = get_gguf_hf_weights_map(hf_model, TensorProcessor(), model_type=self.arch)
        shapes = {name: tuple(t.shape) for name, t in hf_model.state_dict().items()}
        linear = {f"{n}.weight" for n, m in hf_model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"}
        return names, shapes, linear

    def _check(self, tensor: ReaderTensor) -> None:
        if tensor.name == ROPE_FREQS:
            return
        if tensor.name not in self.hf_names:
            raise ValueError(
                f"GGUF tensor {tensor.name}: no {self.config.architectures[0]} tensor corresponds to it "
                f"(a {self.arch} file should not hold it)"
            )
        hf_name = self.hf_names[tensor.name]
        if tensor.tensor_type not in SUPPORTED_TYPES:
            raise ValueError(
                f"GGUF tensor {tensor.name}: type {tensor.tensor_type.name} is not supported (supported: "
                f"{', '.join(t.name for t in SUPPORTED_TYPES)}); requantize the model to one of these with "
                "llama.cpp's llama-quantize"
            )
        shape = tuple(reversed([int(d) for d in tensor.shape]))
        if shape != self.hf_shapes[hf_name]:
            raise ValueError(
                f"GGUF tensor {tensor.name} ({hf_name}) is {list(shape)}, but the config in the file's metadata "
                f"needs {list(self.hf_shapes[hf_name])}: the file is inconsistent; convert the model again"
            )

    def _plan_linear_layers(self, linear: set[str]) -> None:
        """Which linear weights stay quantized, and how: the shards of one fused layer together."""
        layers: dict[str, list[tuple[str, GGMLQuantizationType]]] = {}
        for gguf_name, tensor in self.tensors.items():
            hf_name = self.hf_names.get(gguf_name)
            if hf_name in linear:
                layers.setdefault(fused_module_name(hf_name), []).append((hf_name, tensor.tensor_type))
        self.quantized_linear: set[str] = set()
        targets = []
        for shards in layers.values():
            layer_quant = layer_quant_for(tuple(qtype for _, qtype in shards))
            if layer_quant is not None:
                for hf_name, _ in shards:
                    targets.append((re.compile(re.escape(hf_name.removesuffix(".weight"))), layer_quant))
                    self.quantized_linear.add(hf_name)
        self.quant = QuantConfig("gguf", None, targets) if targets else None

    def quant_config(self, quantization: str | None) -> QuantConfig | None:
        """The linear layers' layouts (None: every one in float); `quantization` may only be "gguf"."""
        if quantization not in (None, "gguf"):
            raise ValueError(
                f"quantization={quantization!r} but the model is a GGUF file, quantized per tensor as the file "
                "says: leave quantization unset"
            )
        return self.quant

    def _row_order(self, gguf_name: str, rows: int) -> np.ndarray | None:
        """HF row r of a llama q/k tensor is the file's row order[r] (undoing llama.cpp's permute)."""
        if self.arch != "llama" or not re.search(r"\.attn_[qk]\.", gguf_name):
            return None
        heads = self.config.num_attention_heads if ".attn_q." in gguf_name else self.config.num_key_value_heads
        return np.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(0, 2, 1).reshape(-1)

    def weights(self, dtype: torch.dtype, device: torch.device | str) -> Iterator[tuple[str, Any]]:
        """(HF name, tensor) for every tensor of the file: a GGUFWeight for a quantized linear weight
        that stays quantized, else a float tensor (dequantized on `device` in `dtype`)."""
        for tensor in self.reader.tensors:
            if tensor.name == ROPE_FREQS:
                continue
            hf_name = self.hf_names[tensor.name]
            shape = self.hf_shapes[hf_name]
            order = self._row_order(tensor.name, shape[0])
            if tensor.tensor_type in FLOAT_TYPES:
                data = np.array(tensor.data)
                if tensor.tensor_type == GGMLQuantizationType.BF16:
                    values = torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
                else:
                    values = torch.from_numpy(data)
                values = values.reshape(shape)
                yield hf_name, values if order is None else values[torch.from_numpy(order)]
                continue
            raw = tensor.data.reshape(int(np.prod(shape[:-1])), -1)
            weight = GGUFWeight(tensor.name, tensor.tensor_type, (raw.shape[0], shape[-1]), raw, order)
            if hf_name in self.quantized_linear:
                yield hf_name, weight
            else:
                values = dequantize_gguf(weight.bytes_on(torch.device(device)), weight.qtype, shape[-1], dtype)
                yield hf_name, values.reshape(shape)
