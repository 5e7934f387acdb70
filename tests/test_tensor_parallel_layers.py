"""Tensor-parallel layers against the whole layer.

- With 2 gloo ranks (one spawn for all checks): column-parallel fused QKV (one KV head for two
  ranks: replicated) and gate/up, row-parallel with its all-reduce and a bias added once,
  vocab-parallel embedding and LM head with a vocabulary that does not divide evenly.
- In one process (loading needs no collective): each rank's shard of a quantized checkpoint, read
  from its slices of the safetensors file, dequantizes to exactly its rows or columns of the whole
  layer's weight, format by format; formats that cannot be split are refused by name.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch
from torch import nn
from tp_layer_checks import check_layers_on_rank, load  # this folder (pytest puts it on sys.path)

from tritonllm.distributed.executor import _free_port
from tritonllm.distributed.parallel_state import SINGLE, TensorParallel, destroy_tensor_parallel
from tritonllm.distributed.shard import RankSlice
from tritonllm.kernels.quant_formats import QuantizedWeight, QuantScheme
from tritonllm.kernels.reference import dequantize_weight
from tritonllm.layers.linear import ColumnParallelLinear, Linear, QKVLinear, RowParallelLinear
from tritonllm.models.loader import load_model
from tritonllm.models.tiny import tiny_model_path
from tritonllm.quantization.config import LayerQuant
from tritonllm.quantization.export import export_quantized
from tritonllm.quantization.quantize import quantize_weight

# ---- collectives: 2 gloo ranks -------------------------------------------------------------


def test_split_layers_on_two_gloo_ranks_compute_what_the_whole_layers_do():
    """This process is rank 0, a spawned process rank 1 (tp_layer_checks.py)."""
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    rank1 = mp.get_context("spawn").Process(target=check_layers_on_rank, args=(1, init_method), daemon=True)
    rank1.start()
    try:
        check_layers_on_rank(0, init_method)
    finally:
        rank1.join(30)
        if rank1.exitcode is None:
            rank1.kill()
            destroy_tensor_parallel(TensorParallel(0, 2))
    assert rank1.exitcode == 0


# ---- quantized checkpoints: each rank's shard, in one process --------------------------------


def _dense(layer: Linear) -> torch.Tensor:
    """The float [N, K] weight a layer's (quantized) storage stands for."""
    quantized = [v for v in vars(layer).values() if isinstance(v, QuantizedWeight)]
    return dequantize_weight(quantized[0]) if quantized else layer.weight.float()


def _expected_part(whole: Linear, part: Linear, w: torch.Tensor) -> torch.Tensor:
    """The rows (column-parallel) or columns (row-parallel) of the whole layer's `w` the rank holds."""
    if isinstance(part, RowParallelLinear):
        cols = part.rank_cols
        return w[:, cols.first : cols.first + cols.count]
    offsets = getattr(whole, "shard_offsets", {None: (0, w.shape[0])})
    return torch.cat([w[offsets[s][0] + r.first :][: r.count] for s, r in part.rank_rows.items()])


def _shards(path: str, size: int) -> tuple[nn.Module, list[nn.Module]]:
    whole, _ = load_model(path, torch.float32, "cpu")
    return whole, [load_model(path, torch.float32, "cpu", tp=TensorParallel(r, size))[0] for r in range(size)]


@pytest.mark.parametrize(
    "layout", ["ct-fp8-channel", "fp8-tensor-static", "ct-int8-channel", "gptq-g128", "gptq-channel-v2", "awq-g128",
               "ct-w4a16-g64", "mxfp4"],
)  # fmt: skip
def test_each_rank_loads_its_rows_or_columns_of_a_quantized_checkpoint(layout, tmp_path):
    folder = export_quantized(tiny_model_path("LlamaForCausalLM"), tmp_path / layout, layout)
    whole, parts = _shards(str(folder), 2)
    checked = 0
    for name, layer in whole.named_modules():
        if not isinstance(layer, Linear):
            continue
        w = _dense(layer)
        for rank, model in enumerate(parts):
            part = model.get_submodule(name)
            assert isinstance(part, (ColumnParallelLinear, RowParallelLinear))
            assert torch.equal(_dense(part), _expected_part(layer, part, w)), (name, rank)
            checked += 1
    assert checked == 2 * 4 * whole.num_layers  # qkv, o, gate_up, down per layer, on each rank
    head = whole.lm_head.weight
    assert torch.equal(torch.cat([m.lm_head.weight for m in parts])[: head.shape[0]], head)


@pytest.mark.parametrize(
    ("layout", "refusal"),
    [("gptq-g32-act-order", "act order"), ("fp8-block", r"would split its elements of 128")],
)
def test_a_quantized_layout_a_split_would_break_is_refused_naming_why(layout, refusal, tmp_path):
    """Act order permutes K across the ranks' columns; the tiny model's k_proj has 128 rows, 64 a
    rank, which cuts its 128-row FP8 scale blocks."""
    folder = export_quantized(tiny_model_path("LlamaForCausalLM"), tmp_path / layout, layout)
    with pytest.raises(ValueError, match=refusal):
        load_model(str(folder), torch.float32, "cpu", tp=TensorParallel(1, 2))


def test_block_fp8_layers_split_on_block_boundaries_keep_their_scale_blocks():
    scheme = QuantScheme(torch.float8_e4m3fn, "block", "group")
    quant = LayerQuant(scheme, online=False, scale_name="weight_scale_inv")
    q = quantize_weight(torch.randn(256, 512, generator=torch.Generator().manual_seed(0)), scheme)
    tensors = {"weight": q.data, "weight_scale_inv": q.scale}
    w = dequantize_weight(q)
    for rank in range(2):
        tp = TensorParallel(rank, 2)
        column = load(ColumnParallelLinear(512, 256, False, torch.float32, quant, tp), tensors)
        assert torch.equal(_dense(column), w[128 * rank : 128 * (rank + 1)])
        row = load(RowParallelLinear(512, 256, False, torch.float32, quant, tp), tensors)
        assert torch.equal(_dense(row), w[:, 256 * rank : 256 * (rank + 1)])
    assert column.rank_rows[None] == RankSlice(128, 128, 256)


def test_a_layer_that_does_not_divide_among_the_ranks_is_refused():
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\) is not divisible by tensor_parallel_size 3"):
        QKVLinear(32, 8, 4, 4, False, torch.float32, tp=TensorParallel(0, 3))
    assert SINGLE.share(7, "rows") == (0, 7)
