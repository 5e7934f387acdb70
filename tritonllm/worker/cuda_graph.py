"""CUDA/HIP graphs for decode steps: a pure-decode forward replayed from a captured graph.

A decode step of a small batch is launch-bound: Llama-3-8B launches ~330 kernels a step from
Python. The runner captures the model's forward once per padded batch size (1, 2, 4, 8, then
multiples of 8 up to max_num_seqs) over static input buffers. A step whose sequences all have one
new token copies its inputs into the buffers of the smallest captured size that holds it (one
host-to-device copy per buffer), replays that graph, and reads the first rows of its output.

Padding rows: token 0 at position 0, cache slot -1 (no write), one key in block 0 (a readable
block): they compute values nobody reads. Every graph's attention plan is built at capture for
max_query_len 1 and max_seq_len = max_model_len, so any decode batch of its size is served.

Graphs share one memory pool (captured largest first). The LM head and sampling run eagerly
after the replay. Without a GPU (tests), `capture=False` runs the same padded static-buffer path
eagerly, which checks padding and buffer handling.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from tritonllm.engine.kv_cache import cdiv
from tritonllm.layers.attention import AttentionMetadata

logger = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Padded batch sizes with a graph: 1, 2, 4, 8, multiples of 8, and max_num_seqs itself."""
    sizes = {1, 2, 4, 8, *range(16, max_num_seqs + 1, 8), max_num_seqs}
    return sorted(s for s in sizes if s <= max_num_seqs)


class DecodeGraphs:
    def __init__(
        self,
        model: torch.nn.Module,
        kv_caches: list,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
        device: torch.device,
        capture: bool = True,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.max_model_len = max_model_len
        self.sizes = capture_sizes(max_num_seqs)
        size, max_blocks = self.sizes[-1], cdiv(max_model_len, block_size)
        self.input_ids = torch.zeros(size, dtype=torch.int64, device=device)
        self.positions = torch.zeros(size, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((size,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros(size, max_blocks, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(size, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(size + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def _forward(self, size: int) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            block_tables=self.block_tables[:size],
            seq_lens=self.seq_lens[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            max_query_len=1,
            max_seq_len=self.max_model_len,
        )
        return self.model(self.input_ids[:size], self.positions[:size], self.kv_caches, meta)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        start = time.perf_counter()
        pool = None
        for size in reversed(self.sizes):
            self._forward(size)  # compiles kernels and fills launch caches outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info("captured decode graphs for %d batch sizes up to %d in %.1f s", len(self.sizes),
                    self.max_batch, time.perf_counter() - start)  # fmt: skip

    @torch.inference_mode()
    def run(
        self,
        input_ids: np.ndarray,
        positions: np.ndarray,
        slot_mapping: np.ndarray,
        block_tables: np.ndarray,
        seq_lens: np.ndarray,
    ) -> torch.Tensor:
        """Hidden states [n, hidden] of n <= max_batch decode rows (numpy inputs from the runner);
        the tensor is the graph's output buffer, valid until the next replay."""
        n = input_ids.shape[0]
        size = next(s for s in self.sizes if s >= n)
        pad = size - n
        width = block_tables.shape[1]

        def put(buffer: torch.Tensor, values: np.ndarray, fill: int) -> None:
            if pad:
                values = np.concatenate([values, np.full((pad, *values.shape[1:]), fill, dtype=values.dtype)])
            buffer.copy_(torch.from_numpy(values), non_blocking=True)

        put(self.input_ids[:size], input_ids.astype(np.int64, copy=False), 0)
        put(self.positions[:size], positions.astype(np.int64, copy=False), 0)
        put(self.slot_mapping[:size], slot_mapping.astype(np.int64, copy=False), -1)
        put(self.seq_lens[:size], seq_lens.astype(np.int32, copy=False), 1)
        put(self.block_tables[:size, :width], block_tables.astype(np.int32, copy=False), 0)
        graph = self.graphs.get(size)
        if graph is None:  # capture=False: the same padded buffers, run eagerly
            return self._forward(size)[:n]
        graph.replay()
        return self.outputs[size][:n]
