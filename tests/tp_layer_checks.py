"""What each of two gloo ranks checks in test_tensor_parallel_layers.py: its split layers against
the whole ones. A module of its own, light to import: the spawned rank imports it."""

from __future__ import annotations

import torch
from torch import nn

from tritonllm.distributed.parallel_state import destroy_tensor_parallel, init_tensor_parallel
from tritonllm.kernels.registry import bind_kernels, select_kernels
from tritonllm.layers.embedding import LMHead, VocabEmbedding
from tritonllm.layers.linear import Linear, MergedLinear, QKVLinear, RowParallelLinear


def load(layer: nn.Module, tensors: dict[str, torch.Tensor], shards: dict[str, str] | None = None) -> nn.Module:
    bind_kernels(layer, select_kernels(default="torch_ref"))
    for name, t in tensors.items():
        shard_id = (shards or {}).get(name)
        layer.load_param(name.split(".")[-1], t, shard_id)
    if isinstance(layer, Linear):
        layer.finish_loading()
    return layer


def check_layers_on_rank(rank: int, init_method: str) -> None:
    tp = init_tensor_parallel(rank, 2, init_method, torch.device("cpu"), timeout_s=60)
    gen = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=gen)  # the same on every rank
    x = rand(5, 32)
    with torch.inference_mode():
        # q/k/v: 4 heads of 8, one KV head (replicated: both ranks hold it)
        qkv = {"q.weight": rand(32, 32), "k.weight": rand(8, 32), "v.weight": rand(8, 32), "q.bias": rand(32),
               "k.bias": rand(8), "v.bias": rand(8)}  # fmt: skip
        shards = {name: name[0] for name in qkv}
        whole = load(QKVLinear(32, 8, 4, 1, True, torch.float32), qkv, shards)
        part = load(QKVLinear(32, 8, 4, 1, True, torch.float32, tp=tp), qkv, shards)
        q, k, v = whole.split(whole(x))
        want = torch.cat([q[:, 16 * rank : 16 * rank + 16], k, v], dim=1)
        torch.testing.assert_close(part(x), want)

        gate_up = {"gate.weight": rand(48, 32), "up.weight": rand(48, 32)}
        shards = {"gate.weight": "gate", "up.weight": "up"}
        whole = load(MergedLinear(32, {"gate": 48, "up": 48}, False, torch.float32), gate_up, shards)
        part = load(MergedLinear(32, {"gate": 48, "up": 48}, False, torch.float32, tp=tp), gate_up, shards)
        gate, up = whole.split(whole(x))
        torch.testing.assert_close(
            part(x), torch.cat([gate[:, 24 * rank : 24 * (rank + 1)], up[:, 24 * rank : 24 * (rank + 1)]], 1)
        )

        down = {"weight": rand(32, 48), "bias": rand(32)}
        h = rand(5, 48)
        whole = load(Linear(48, 32, True, torch.float32), down)
        part = load(RowParallelLinear(48, 32, True, torch.float32, tp=tp), down)
        assert (part.bias is None) == (rank == 1)  # added once, by rank 0
        torch.testing.assert_close(part(h[:, 24 * rank : 24 * (rank + 1)]), whole(h))

        vocab = {"weight": rand(37, 16)}  # 37 rows: 19 and 18 (+ a zero row) per rank
        ids = torch.tensor([0, 18, 19, 36, 5, 30])
        torch.testing.assert_close(load(VocabEmbedding(37, 16, torch.float32, tp), vocab)(ids), vocab["weight"][ids])
        hidden = rand(3, 16)
        logits = load(LMHead(37, 16, torch.float32, tp=tp), vocab)(hidden)
        torch.testing.assert_close(logits, hidden @ vocab["weight"].T)
    destroy_tensor_parallel(tp)
