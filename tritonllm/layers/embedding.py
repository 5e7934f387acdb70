"""Token embedding and the LM head; with tied embeddings the head reuses the embedding weight."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tritonllm.kernels.registry import default_kernels


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [num_tokens] -> [num_tokens, hidden]."""
        return F.embedding(input_ids, self.weight)


class LMHead(nn.Module):
    """logits = hidden @ weight.T, weight [vocab, hidden]; `tied_to` shares the embedding's weight."""

    def __init__(
        self, vocab_size: int, hidden_size: int, dtype: torch.dtype, tied_to: VocabEmbedding | None = None
    ) -> None:
        super().__init__()
        self.kernels = default_kernels()  # the engine binds its own (kernels/registry.py)
        if tied_to is not None:
            self.weight = tied_to.weight
        else:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, hidden] -> logits [n, vocab] in the model's dtype: the GEMM's own output, so no
        precision is lost to a cast. Sampling reads them as they are (for bf16, its threshold
        searches run over 16-bit keys: half the passes and bytes of float32); log-probs are
        computed in float32."""
        return self.kernels.linear(hidden, self.weight, None)
