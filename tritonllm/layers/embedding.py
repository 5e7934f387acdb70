"""Token embedding and the LM head; with tied embeddings the head reuses the embedding weight.

With tensor parallelism both are split by vocabulary: each rank holds cdiv(vocab, tp) rows (the
last rank's tail, past the vocabulary, zero). The embedding looks up the ids in its rows (others
give zeros) and all-reduces; the head computes its rows' logits and all-gathers them, so every
rank holds the whole [n, vocab] logits that sampling reads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tritonllm.distributed.parallel_state import SINGLE, TensorParallel
from tritonllm.kernels.registry import default_kernels
from tritonllm.loader.safetensors_loader import CheckpointSlice, materialize
from tritonllm.quantization.methods import copy_weight


class VocabShard:
    """The rows of a [vocab, hidden] matrix a rank holds: rows_per_rank from first_row."""

    def __init__(self, vocab_size: int, tp: TensorParallel) -> None:
        self.vocab_size = vocab_size
        self.rows_per_rank = -(-vocab_size // tp.size)
        self.first_row = tp.rank * self.rows_per_rank
        self.is_split = tp.size > 1

    def load(self, weight: torch.Tensor, name: str, loaded: torch.Tensor | CheckpointSlice) -> None:
        """Copy this rank's rows of the checkpoint's [vocab, hidden] `loaded` (zeros past the vocabulary)."""
        if not self.is_split:
            copy_weight(weight, materialize(loaded), name)
            return
        if tuple(loaded.shape) != (self.vocab_size, weight.shape[1]):
            raise ValueError(f"{name}: the checkpoint's shape {tuple(loaded.shape)} is not the model's")
        count = max(0, min(self.rows_per_rank, self.vocab_size - self.first_row))
        weight[count:].zero_()
        copy_weight(weight[:count], loaded.narrow(0, self.first_row, count), name)


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.rows = VocabShard(vocab_size, tp)
        self.weight = nn.Parameter(torch.empty(self.rows.rows_per_rank, hidden_size, dtype=dtype), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [num_tokens] -> [num_tokens, hidden]."""
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.rows.first_row
        mine = (local >= 0) & (local < self.rows.rows_per_rank)
        out = F.embedding(torch.where(mine, local, 0), self.weight)
        return self.tp.all_reduce(out.masked_fill_(~mine[:, None], 0.0))

    def load_param(self, name: str, loaded: torch.Tensor | CheckpointSlice, shard_id: str | None = None) -> None:
        if shard_id is not None:
            raise ValueError(f"shard {shard_id!r} of an embedding")
        self.rows.load(self.weight.data, name, loaded)


class LMHead(nn.Module):
    """logits = hidden @ weight.T, weight [vocab, hidden]; `tied_to` shares the embedding's weight."""

    def __init__(
        self, vocab_size: int, hidden_size: int, dtype: torch.dtype, tied_to: VocabEmbedding | None = None,
        tp: TensorParallel = SINGLE,
    ) -> None:  # fmt: skip
        super().__init__()
        self.kernels = default_kernels()  # the engine binds its own (kernels/registry.py)
        self.tp = tp
        self.rows = VocabShard(vocab_size, tp)
        if tied_to is not None:
            self.weight = tied_to.weight
        else:
            shape = (self.rows.rows_per_rank, hidden_size)
            self.weight = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)

    def load_param(self, name: str, loaded: torch.Tensor | CheckpointSlice, shard_id: str | None = None) -> None:
        if shard_id is not None:
            raise ValueError(f"shard {shard_id!r} of an LM head")
        self.rows.load(self.weight.data, name, loaded)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, hidden] -> logits [n, vocab] in the model's dtype: the GEMM's own output, so no
        precision is lost to a cast. Sampling reads them as they are (for bf16, its threshold
        searches run over 16-bit keys: half the passes and bytes of float32); log-probs are
        computed in float32. Split by vocabulary, the ranks' logits are gathered (every rank gets all)."""
        logits = self.kernels.linear(hidden, self.weight, None)
        if self.tp.size == 1:
            return logits
        logits = self.tp.all_gather(logits)
        vocab = self.rows.vocab_size
        return logits if logits.shape[-1] == vocab else logits[:, :vocab].contiguous()
