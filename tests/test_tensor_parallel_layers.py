"""Tensor-parallel layers against the whole layer.

- With 2 gloo ranks (one spawn for all checks): column-parallel fused QKV (one KV head for two
  ranks: replicated) and gate/up, row-parallel with its all-reduce and a bias added once,
  vocab-parallel embedding and LM head with a vocabulary that does not divide evenly.
- In one process (loading needs no collective): each rank's shard of a quantized checkpoint, read
  from its slices of the safetensors file, dequantizes to exactly its rows or columns of the whole
  layer's weight, format by format; formats that cannot be split are refused by name.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from tritonllm.distributed.executor import _free_port
from tritonllm.distributed.parallel_state import SINGLE, TensorParallel, init_tensor_parallel
from tritonllm.distributed.shard import RankSlice
from tritonllm.kernels.quant_formats import QuantizedWeight, QuantScheme
from tritonllm.kernels.reference import dequantize_weight
from tritonllm.kernels.registry import bind_kernels, select_kernels
from tritonllm.layers.embedding import LMHead, VocabEmbedding
from tritonllm.layers.linear import ColumnParallelLinear, Linear, MergedLinear, QKVLinear, RowParallelLinear
from tritonllm.models.loader import load_model
from tritonllm.models.tiny import tiny_model_path
from tritonllm.quantization.config import LayerQuant
from tritonllm.quantization.export import export_quantized
from tritonllm.quantization.quantize import quantize_weight

# ---- collectives: 2 gloo ranks -------------------------------------------------------------


def _load(layer: nn.Module, tensors: dict[str, torch.Tensor], shards: dict[str, str] | None = None) -> nn.Module:
    bind_kernels(layer, select_kernels(default="torch_ref"))
    for name, t in tensors.items():
        shard_id = (shards or {}).get(name)
        layer.load_param(name.split(".")[-1], t, shard_id)
    if isinstance(layer, Linear):
        layer.finish_loading()
    return layer


def _check_layers_on_rank(rank: int, init_method: str) -> None:
    tp = init_tensor_parallel(rank, 2, init_method, torch.device("cpu"), timeout_s=60)
    gen = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=gen)  # the same on every rank
    x = rand(5, 32)
    with torch.inference_mode():
        # q/k/v: 4 heads of 8, one KV head (replicated: both ranks hold it)
        qkv = {"q.weight": rand(32, 32), "k.weight": rand(8, 32), "v.weight": rand(8, 32), "q.bias": rand(32),
               "k.bias": rand(8), "v.bias": rand(8)}  # fmt: skip
        shards = {name: name[0] for name in qkv}
        whole = _load(QKVLinear(32, 8, 4, 1, True, torch.float32), qkv, shards)
        part = _load(QKVLinear(32, 8, 4, 1, True, torch.float32, tp=tp), qkv, shards)
        q, k, v = whole.split(whole(x))
        want = torch.cat([q[:, 16 * rank : 16 * rank + 16], k, v], dim=1)
        torch.testing.assert_close(part(x), want)

        gate_up = {"gate.weight": rand(48, 32), "up.weight": rand(48, 32)}
        shards = {"gate.weight": "gate", "up.weight": "up"}
        whole = _load(MergedLinear(32, {"gate": 48, "up": 48}, False, torch.float32), gate_up, shards)
        part = _load(MergedLinear(32, {"gate": 48, "up": 48}, False, torch.float32, tp=tp), gate_up, shards)
        gate, up = whole.split(whole(x))
        torch.testing.assert_close(
            part(x), torch.cat([gate[:, 24 * rank : 24 * (rank + 1)], up[:, 24 * rank : 24 * (rank + 1)]], 1)
        )

        down = {"weight": rand(32, 48), "bias": rand(32)}
        h = rand(5, 48)
        whole = _load(Linear(48, 32, True, torch.float32), down)
        part = _load(RowParallelLinear(48, 32, True, torch.float32, tp=tp), down)
        assert (part.bias is None) == (rank == 1)  # added once, by rank 0
        torch.testing.assert_close(part(h[:, 24 * rank : 24 * (rank + 1)]), whole(h))

        vocab = {"weight": rand(37, 16)}  # 37 rows: 19 and 18 (+ a zero row) per rank
        ids = torch.tensor([0, 18, 19, 36, 5, 30])
        torch.testing.assert_close(_load(VocabEmbedding(37, 16, torch.float32, tp), vocab)(ids), vocab["weight"][ids])
        hidden = rand(3, 16)
        logits = _load(LMHead(37, 16, torch.float32, tp=tp), vocab)(hidden)
        torch.testing.assert_close(logits, hidden @ vocab["weight"].T)


def test_split_layers_on_two_gloo_ranks_compute_what_the_whole_layers_do():
    mp.spawn(_check_layers_on_rank, args=(f"tcp://127.0.0.1:{_free_port()}",), nprocs=2, join=True)


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
        column = _load(ColumnParallelLinear(512, 256, False, torch.float32, quant, tp), tensors)
        assert torch.equal(_dense(column), w[128 * rank : 128 * (rank + 1)])
        row = _load(RowParallelLinear(512, 256, False, torch.float32, quant, tp), tensors)
        assert torch.equal(_dense(row), w[:, 256 * rank : 256 * (rank + 1)])
    assert column.rank_rows[None] == RankSlice(128, 128, 256)


def test_a_layer_that_does_not_divide_among_the_ranks_is_refused():
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\) is not divisible by tensor_parallel_size 3"):
        QKVLinear(32, 8, 4, 4, False, torch.float32, tp=TensorParallel(0, 3))
    assert SINGLE.share(7, "rows") == (0, 7)
