"""CUDA/HIP graphs for decode steps: forward, LM head and sampling replayed from a captured graph.

A decode step of a small batch is launch-bound: Llama-3-8B launches ~330 kernels a step from
Python. The runner captures, once per padded batch size (1, 2, 4, 8, then multiples of 8 up to
max_num_seqs), everything a pure-decode step does on the device: the block-table entries it
gained, the token still in flight (read from the runner's `last_sampled`), the block tables and
sampling parameters gathered from the persistent batch by row, the forward, the logits and the
sampled tokens (written to `last_sampled`). A step packs its inputs into the staging buffer in
DECODE_LAYOUT for its padded size (one host-to-device copy), which is where the graph of that
size reads them, and replays it: no other launch on the host.

Padding rows: token 0 at position 0, cache slot -1 (no write), one key in the dummy row's block
(block 0, readable), block-table entries into the dummy row: they compute values nobody reads.
Every graph's attention plan is built at capture for max_query_len 1 and max_seq_len =
max_model_len, so any decode batch of its size is served.

Graphs share one memory pool (captured largest first); each keeps only its hidden-state output
alive, so a step that needs logprobs or min_tokens bans can recompute its logits from it. Without a
GPU (tests), `capture=False` runs the same padded static-buffer path eagerly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import torch

from tritonllm.kernels.launch import arrival_counters
from tritonllm.worker.staging import StagingBuffer

logger = logging.getLogger(__name__)

Body = Callable[[int, dict[str, torch.Tensor]], torch.Tensor]

# A decode graph's inputs in staging order: (name, extra length beyond the padded size, dtype).
DECODE_LAYOUT: list[tuple[str, int, torch.dtype]] = [
    ("input_ids", 0, torch.int64),
    ("positions", 0, torch.int64),
    ("slot_mapping", 0, torch.int64),
    ("prev_src", 0, torch.int64),  # index into last_sampled, -1 where input_ids holds the token
    ("rows", 0, torch.int64),
    ("entry_rows", 0, torch.int64),  # block-table entries gained this step (at most one a row)
    ("entry_cols", 0, torch.int64),
    ("entry_vals", 0, torch.int32),
    ("seq_lens", 0, torch.int32),
    ("query_start_loc", 1, torch.int32),
]


def graph_entries(entries: tuple[np.ndarray, np.ndarray, np.ndarray] | None, size: int):
    """The block-table entries (rows, columns, block ids) a decode graph of `size` rows applies itself: all of
    them when they fit its layout and each row has at most one (kernels/step_inputs.py patches one a row), as a
    decode step's are (a row gains at most one block a step); else None, and the runner applies them before."""
    if entries is None or len(entries[0]) > size or len(np.unique(entries[0])) != len(entries[0]):
        return None
    return entries


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Padded batch sizes with a graph: 1, 2, 4, 8, multiples of 8, and max_num_seqs itself."""
    sizes = {1, 2, 4, 8, *range(16, max_num_seqs + 1, 8), max_num_seqs}
    return sorted(s for s in sizes if s <= max_num_seqs)


def decode_views(staging: StagingBuffer, size: int) -> dict[str, torch.Tensor]:
    """The device views that a step packed in DECODE_LAYOUT for `size` rows lands in."""
    slots = StagingBuffer.layout([(size + extra, dtype) for _, extra, dtype in DECODE_LAYOUT])
    return {name: staging.view(*slot) for (name, _, _), slot in zip(DECODE_LAYOUT, slots)}


def dummy_decode_inputs(size: int, dummy_row: int) -> dict[str, np.ndarray]:
    """DECODE_LAYOUT inputs whose every row is padding."""
    i64 = lambda fill: np.full(size, fill, dtype=np.int64)
    return {
        "input_ids": i64(0),
        "positions": i64(0),
        "slot_mapping": i64(-1),
        "prev_src": i64(-1),
        "rows": i64(dummy_row),
        "entry_rows": i64(dummy_row),
        "entry_cols": i64(0),
        "entry_vals": np.zeros(size, dtype=np.int32),
        "seq_lens": np.ones(size, dtype=np.int32),
        "query_start_loc": np.arange(size + 1, dtype=np.int32),
    }


class DecodeGraphs:
    def __init__(self, staging: StagingBuffer, max_num_seqs: int, dummy_row: int) -> None:
        self.staging = staging
        self.dummy_row = dummy_row
        self.sizes = capture_sizes(max_num_seqs)
        self.views = {size: decode_views(staging, size) for size in self.sizes}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def padded_size(self, n: int) -> int:
        return next(s for s in self.sizes if s >= n)

    def _stage_padding(self, size: int) -> None:
        self.staging.begin()
        inputs = dummy_decode_inputs(size, self.dummy_row)
        for name, _, _ in DECODE_LAYOUT:
            self.staging.put(inputs[name])
        self.staging.send()

    @torch.inference_mode()
    def capture(self, body: Body) -> None:
        """Capture `body` (the runner's decode step: (size, input views) -> hidden states, tokens
        sampled into its last_sampled) at every size. The graphs keep no reference to the runner."""
        start = time.perf_counter()
        # the kernels that count arrivals (split-K GEMMs, split-KV attention, the fused MoE router) find their
        # counters allocated before any capture, whichever sizes their warm-ups took
        arrival_counters(torch.device("cuda", torch.cuda.current_device()))
        pool = None
        for size in reversed(self.sizes):
            self._stage_padding(size)  # valid inputs for the warm-up and the capture
            body(size, self.views[size])  # compiles kernels and fills launch caches outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = body(size, self.views[size])
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info("captured decode graphs for %d batch sizes up to %d in %.1f s", len(self.sizes),
                    self.max_batch, time.perf_counter() - start)  # fmt: skip

    def run(self, size: int, body: Body) -> torch.Tensor:
        """Replay the graph of `size` rows over the inputs a step staged in its layout; returns its
        hidden states [size, hidden] (valid until the next replay). Not captured (CPU tests): the
        same padded buffers through `body`, eagerly."""
        graph = self.graphs.get(size)
        if graph is None:
            return body(size, self.views[size])
        graph.replay()
        return self.outputs[size]
