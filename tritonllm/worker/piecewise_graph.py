"""Piecewise CUDA/HIP graphs for prefill and mixed steps: everything but attention from graphs.

A prefill or mixed (chunked prefill + decode) step runs its forward eagerly: ~12 kernel launches a
layer from Python, and the H200 sat idle 35.7% of such steps (experiments/host_loop). One graph per
step shape cannot hold attention: its grid, plan and split count depend on the step's sequences
(query and context lengths), which vary at any token count. So, as vLLM does (without
torch.compile), the forward of each padded token count (`piecewise_sizes`) is captured as L + 1
graphs split at the layers' attention calls, and attention runs eagerly between them over the
step's real metadata.

Splitting: `AttentionMetadata.piecewise` is a hook that every `Attention.forward` hands its q, k,
v to. During capture the hook ends the graph being captured, records the layer and views of q, k,
v that do not own their memory (`weak_view`), begins the next graph in the same memory pool and
returns a view of one static attention-output buffer [max tokens, num_heads * head_dim], shared by
all layers and sizes: layer i's attention writes it, graph i + 1 reads it before layer i + 1's
attention writes it again. The last graph ends after the model's final norm.

RoPE and the KV write (`rope_kv_write`) go into the graphs too with `rope_kv_write=True` (the engine's
`piecewise_rope_kv_write`, off by default: on the H200 no faster, session 45; where the layer fuses them and the
kernel is capturable): they depend only on the positions and the slot mapping, which
the step copies into static buffers (padding rows' slots -1: written nowhere), so each layer's eager work
between two graphs is one attention launch, not two (a mixed step's host time; issue 15).

Replay of a step of n tokens, padded to the next size B: its ids, positions and slots go to static
input buffers (padding rows keep earlier, valid ids and positions; their slots are -1), then for each
layer graph i replays (ending with RoPE of q and k and their KV written) and `Attention.run` attends
over the step's real metadata into the output buffer's rows [:n] (without `rope_kv_write` it first
rotates q and k of rows [:n] and writes their KV itself); the last graph gives the hidden states, of
which rows [:n] are returned. Padding rows run through the graphs but only through row-wise ops
(GEMMs, norms, activation, RoPE): their values reach no real row, no KV slot and no logit.

Memory: all sizes' graphs share one pool, captured largest first; q, k, v and the output are held
only through weak views, so the pool is about one largest-size forward's activations, as a single
graph's would be. Without a GPU (tests), the same padded static-buffer path runs eagerly: the hook
then runs each layer's attention at once.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import torch
from torch import nn

from tritonllm.layers.attention import Attention, AttentionMetadata, Rope

logger = logging.getLogger(__name__)

KVCache = tuple[torch.Tensor, torch.Tensor]


def piecewise_sizes(max_num_tokens: int, first: int = 256) -> list[int]:
    """Padded token counts with graphs: multiples of `first` up to 8 x first, then four per
    doubling (at most 25% padding there), and max_num_tokens itself. 256 up to 8192: 16 sizes."""
    if first < 1 or max_num_tokens < 1:
        raise ValueError(f"piecewise sizes need a positive first size and token budget (got {first}, {max_num_tokens})")
    sizes, size, step = [], first, first
    while size < max_num_tokens:
        sizes.append(size)
        if size >= 8 * step:
            step *= 2
        size += step
    return [*sizes, max_num_tokens]


def weak_view(t: torch.Tensor) -> torch.Tensor:
    """A tensor over t's memory (same offset, shape, strides) that does not own it, as
    torch/_inductor/cudagraph_trees.py and vLLM's weak_ref_tensors build them.

    Why it is safe for a graph pool: a layer's q, k, v are made by graph i and read by its eager
    attention before graph i + 1 replays; all on one stream, and no other size's graphs replay in
    between. Likewise a size's output, which the step reads (logits) before any other replay.
    Holding real references would keep every layer's q, k, v (GBs at 8192 tokens) and every size's
    output alive in the pool; with weak views their memory is reused by later graphs, as inside one
    graph."""
    storage = t.untyped_storage()
    alias = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), t.device, storage.nbytes())
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(alias, t.storage_offset(), t.shape, t.stride())


@dataclass
class _Piece:
    """One layer's attention between two graphs: its inputs as the earlier graph leaves them."""

    layer: Attention
    q: torch.Tensor  # weak views [size, ...]
    k: torch.Tensor
    v: torch.Tensor
    kv_cache: KVCache
    # q and k before RoPE, which the layer applies (with its KV write) over the static positions buffer
    rope: Rope | None
    # RoPE and the KV write ran inside the graph before this piece (q and k are rotated): attention only
    kv_written: bool = False


@dataclass
class _Bucket:
    graphs: list[torch.cuda.CUDAGraph]  # L + 1
    pieces: list[_Piece]  # L
    output: torch.Tensor  # weak view of the hidden states [size, hidden]


def _rope_write_kv(
    layer: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache, rope: Rope | None,
    slots: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, bool]:  # fmt: skip
    """A split's RoPE + KV write over the padded rows at the static slots (rope_kv_write: `slots` given, the
    layer fusing them): (rotated q, k, True); else (q, k, False), left to the layer's eager run."""
    if slots is None or not layer.fuses_rope(rope):
        return q, k, False
    return (*layer.rope_write_kv(q, k, v, kv_cache, rope, slots), True)


class _CaptureSplit:
    """The hook while a size is captured into `pool`: each attention call closes the graph being
    captured and opens the next. Without a pool (the eager warm-up before the capture) it only
    returns the output buffer. Attention itself does not run: the buffer keeps the finite values
    it held (zeros or earlier attention outputs)."""

    def __init__(self, out: torch.Tensor, pool: tuple[int, int] | None, slots: torch.Tensor | None) -> None:
        self.out = out
        self.pool = pool
        self.slots = slots  # the static slot buffer's rows: RoPE and the KV write in the graph; None: eager
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.pieces: list[_Piece] = []

    def begin(self) -> None:
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool=self.pool)
        self.graphs.append(graph)

    def end(self) -> None:
        self.graphs[-1].capture_end()

    def split(
        self, layer: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache, rope: Rope | None
    ) -> torch.Tensor:
        q, k, written = _rope_write_kv(layer, q, k, v, kv_cache, rope, self.slots)
        if self.pool is not None:
            piece = _Piece(
                layer, weak_view(q), weak_view(k), weak_view(v), kv_cache, None if written else rope, written
            )
            self.pieces.append(piece)
            self.end()
            self.begin()
        return self.out


class _EagerSplit:
    """The hook without graphs: the layer's attention over the step's rows [:num_tokens] at once,
    into the output buffer, which it returns at the padded size (what a replay computes)."""

    def __init__(self, out: torch.Tensor, num_tokens: int, meta: AttentionMetadata, slots: torch.Tensor | None) -> None:
        self.out = out
        self.num_tokens = num_tokens
        self.meta = meta
        self.slots = slots  # as _CaptureSplit's: RoPE and the KV write over the padded rows, as a replay does

    def split(
        self, layer: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache, rope: Rope | None
    ) -> torch.Tensor:
        n = self.num_tokens
        q, k, written = _rope_write_kv(layer, q, k, v, kv_cache, rope, self.slots)
        rope = None if written else rope and rope.head(n)
        layer.run(q[:n], k[:n], v[:n], kv_cache, self.meta, out=self.out[:n], rope=rope, kv_written=written)
        return self.out


class PiecewiseGraphs:
    def __init__(
        self, model: nn.Module, max_num_tokens: int, dtype: torch.dtype, device: torch.device, first_size: int = 256,
        rope_kv_write: bool = False,
    ) -> None:  # fmt: skip
        widths = {m.num_heads * m.head_dim for m in model.modules() if isinstance(m, Attention)}
        if len(widths) != 1:
            raise ValueError(
                f"piecewise graphs share one attention-output buffer, so every Attention layer must have the "
                f"same num_heads * head_dim (got {sorted(widths)}); use piecewise_graphs=false for this model"
            )
        self.model = model
        self.device = device
        self.sizes = piecewise_sizes(max_num_tokens, first_size)
        # allocated once, outside any capture; zeros: padding rows read valid ids and positions
        self.input_ids = torch.zeros(self.max_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(self.max_tokens, dtype=torch.int64, device=device)
        self.attn_out = torch.zeros(self.max_tokens, widths.pop(), dtype=dtype, device=device)
        # rope_kv_write: the step's KV slots, -1 past its rows (padding rows write nowhere); rows [:slots_used]
        # hold the last step's, reset before a shorter step
        self.slot_mapping = (
            torch.full((self.max_tokens,), -1, dtype=torch.int64, device=device) if rope_kv_write else None
        )
        self.slots_used = 0
        self.buckets: dict[int, _Bucket] = {}

    @property
    def max_tokens(self) -> int:
        return self.sizes[-1]

    def padded_size(self, num_tokens: int) -> int:
        return next(s for s in self.sizes if s >= num_tokens)

    def _hook_metadata(self, hook: _CaptureSplit) -> AttentionMetadata:
        """Metadata of which the model reads only `piecewise`: every attention call goes to the hook."""
        empty = torch.empty(0, dtype=torch.int32, device=self.device)
        return AttentionMetadata(empty.long(), empty.view(0, 0), empty, empty, 0, 0, piecewise=hook)

    @torch.inference_mode()
    def capture(self, kv_caches: list[KVCache]) -> None:
        """Capture every size, largest first, into one pool. The graphs never touch the KV caches;
        each piece keeps its layer's cache for the eager attention of a replay."""
        start, reserved = time.perf_counter(), torch.cuda.memory_reserved(self.device)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()  # captures run on a side stream, as torch.cuda.graph's do
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for size in reversed(self.sizes):
                self.buckets[size] = self._capture_size(size, kv_caches, pool)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        # the pool should be about one largest-size forward's activations (see the module docstring)
        pool_gib = (torch.cuda.memory_reserved(self.device) - reserved) / 2**30
        logger.info("captured piecewise graphs (%d pieces each) for %d token counts up to %d in %.1f s; pool %.2f GiB",
                    len(self.buckets[self.max_tokens].graphs), len(self.sizes), self.max_tokens,
                    time.perf_counter() - start, pool_gib)  # fmt: skip

    def _capture_size(self, size: int, kv_caches: list[KVCache], pool: tuple[int, int]) -> _Bucket:
        ids, positions, out = self.input_ids[:size], self.positions[:size], self.attn_out[:size]
        slots = None if self.slot_mapping is None else self.slot_mapping[:size]  # all -1 here: no KV written
        warm_up = _CaptureSplit(out, None, slots)
        self.model(ids, positions, kv_caches, self._hook_metadata(warm_up))  # compiles kernels, fills launch caches
        hook = _CaptureSplit(out, pool, slots)
        meta = self._hook_metadata(hook)
        torch.cuda.synchronize()
        hook.begin()
        hidden = self.model(ids, positions, kv_caches, meta)
        hook.end()
        return _Bucket(hook.graphs, hook.pieces, weak_view(hidden))

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache], meta: AttentionMetadata
    ) -> torch.Tensor:
        """The forward of a step of n <= max_tokens tokens (input_ids, positions [n], meta its real
        metadata): the graphs of its padded size with each layer's attention run eagerly between
        them. Returns the hidden states [n, hidden], valid until the next run. Sizes not captured
        (capture=False, CPU tests) take the same padded buffers through the model eagerly."""
        n = input_ids.shape[0]
        size = self.padded_size(n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        slots = self._stage_slots(meta.slot_mapping)
        bucket = self.buckets.get(size)
        if bucket is None or self._calibrating(bucket):
            hook = _EagerSplit(self.attn_out[:size], n, meta, None if slots is None else slots[:size])
            model_meta = dataclasses.replace(meta, piecewise=hook)
            return self.model(self.input_ids[:size], self.positions[:size], kv_caches, model_meta)[:n]
        out = self.attn_out[:n]
        for graph, piece in zip(bucket.graphs, bucket.pieces):
            graph.replay()
            rope = piece.rope and piece.rope.head(n)
            piece.layer.run(piece.q[:n], piece.k[:n], piece.v[:n], piece.kv_cache, meta, out=out, rope=rope,
                            kv_written=piece.kv_written)  # fmt: skip
        bucket.graphs[-1].replay()
        return bucket.output[:n]

    def _stage_slots(self, slot_mapping: torch.Tensor) -> torch.Tensor | None:
        """The step's slots into the static buffer, rows past them -1 (only those a longer step left set)."""
        if self.slot_mapping is None:
            return None
        n = slot_mapping.shape[0]
        self.slot_mapping[:n].copy_(slot_mapping)
        if self.slots_used > n:
            self.slot_mapping[n : self.slots_used].fill_(-1)
        self.slots_used = n
        return self.slot_mapping

    @staticmethod
    def _calibrating(bucket: _Bucket) -> bool:
        """A step that sets the FP8 KV scales (calculate_kv_scales) writes its K/V eagerly, after calibrating:
        the graphs' RoPE + KV write would quantize with the scales it is about to set."""
        first = bucket.pieces[0] if bucket.pieces else None
        return first is not None and first.kv_written and first.layer.calibrate_kv_scales
