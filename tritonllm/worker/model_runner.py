"""Runs one scheduled step on the device: batch inputs, forward pass, logits, sampling.

The runner keeps a persistent batch (input_batch.py) that the scheduler's deltas update (rows
for new requests, rows freed for finished and preempted ones, new block ids); a step's inputs are
built by vectorised numpy over its rows and reach the device in one copy (staging.py). Layers
never see requests.

`execute` launches a step and returns without waiting for the GPU: its `PendingStep.result()`
waits for the step's tokens, copied without blocking to pinned host memory. So the engine can
schedule and launch step N+1 before it reads step N's tokens (overlap scheduling). Sampled tokens
stay on the device in `last_sampled`: a decode whose input token is still in flight (the
scheduler scheduled it on a placeholder) reads it from there, with no host round trip.

On a GPU, pure-decode steps replay whole-step graphs (cuda_graph.py), prefill and mixed steps
piecewise graphs with attention eager between the pieces (piecewise_graph.py).

Owns the KV cache tensors: per layer K and V, each [num_blocks, block_size, num_kv_heads, head_dim].

Tensor parallelism: every rank has a runner over its shard of the model and its KV heads' cache
(the block tables are the same on all ranks). Rank 0's runner, the driver, turns the scheduler's
output into staged arrays and broadcasts them (distributed/step_channel.py); the followers run
the same device work from them (`follow_step`): the forward, and the logits wherever the driver
computes them (the LM head's all-gather is a collective). Only the driver samples; the tokens a
step's inputs read from the step before are broadcast to the followers first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np
import torch

from tritonllm.distributed.parallel_state import SINGLE, TensorParallel
from tritonllm.distributed.step_channel import StepChannel, StepHeader
from tritonllm.engine.kv_cache import cdiv
from tritonllm.engine.output_processor import SampledLogprobs, StepResult
from tritonllm.engine.request import Request
from tritonllm.engine.scheduler import SchedulerOutput
from tritonllm.kernels import step_inputs
from tritonllm.kernels.registry import Kernels, bind_kernels, default_kernels
from tritonllm.layers.attention import Attention, AttentionMetadata
from tritonllm.layers.prefetch import MAX_PREFETCH_SEQS, WeightPrefetch
from tritonllm.layers.sampler import LogprobTensors, Sampler, SamplingTensors, to_host, top_logprobs
from tritonllm.worker.cuda_graph import DECODE_LAYOUT, DecodeGraphs, graph_entries
from tritonllm.worker.input_batch import InputBatch
from tritonllm.worker.logit_adjust import InFlight, logit_adjustments
from tritonllm.worker.piecewise_graph import PiecewiseGraphs
from tritonllm.worker.staging import StagingBuffer

_DECODE_ROWS = [name for name, _, _ in DECODE_LAYOUT].index("rows")
PROMPT_LOGPROBS_ROWS = 1024  # prompt positions whose [rows, vocab] logits are alive at once


def eager_slot_names(has_prev_src: bool) -> list[str]:
    """The arrays an eager step stages, in order (then the batch updates: _put_batch_updates)."""
    names = ["input_ids", "positions", "slot_mapping", "prev_src", "rows", "sample_idx", "sample_rows", "seq_lens"]
    return [name for name in names if has_prev_src or name != "prev_src"] + ["query_start_loc"]


@dataclass
class PendingStep:
    """A launched step; `result()` waits for its outputs and brings them to the host."""

    sampled: list[Request]  # the requests that sample, in row order
    tokens: torch.Tensor  # host copy of their tokens
    logprob_ks: list[int | None] | None  # per sampled request: its top-k, None: no logprobs
    logprobs: LogprobTensors | None  # host copies
    prompt_logprobs: list[tuple[Request, int, LogprobTensors]]  # host copies
    done: torch.cuda.Event | None

    def result(self) -> StepResult:
        if self.done is not None:
            self.done.synchronize()
        logprobs = None
        if self.logprobs is not None:
            top = self.logprobs.tolist()
            logprobs: list[SampledLogprobs | None] = [
                None if k is None else (top.top_ids[i][:k], top.top_logprobs[i][:k], top.token_logprobs[i], top.token_ranks[i])
                for i, k in enumerate(self.logprob_ks)
            ]  # fmt: skip
        prompt = [(r, first, t.tolist()) for r, first, t in self.prompt_logprobs]
        return StepResult(self.sampled, self.tokens.tolist(), logprobs, prompt)


def profile_lens(max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int) -> list[int]:
    """Prompt lengths of the profiling step: the step's token budget over up to max_num_seqs prompts,
    none longer than max_model_len (the rotary tables hold max_model_len positions: a longer prompt
    read past them, an illegal address on the GPU when the budget exceeded max_model_len) and no more
    tokens than max_num_seqs prompts of max_model_len can hold (more could never be scheduled)."""
    num_tokens = max(1, min(max_num_batched_tokens, max_num_seqs * max_model_len))
    num_seqs = max(1, min(max_num_seqs, num_tokens))
    base, extra = divmod(num_tokens, num_seqs)
    return [base + (i < extra) for i in range(num_seqs)]


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        dtype: torch.dtype,
        device: torch.device,
        block_size: int,
        kv_dtype: torch.dtype | None = None,
        *,
        max_num_seqs: int = 256,
        max_model_len: int = 2048,
        max_num_batched_tokens: int = 8192,
        kernels: Kernels | None = None,
        tp: TensorParallel = SINGLE,
    ) -> None:
        self.model = model
        self.tp = tp
        self.is_driver = tp.rank == 0  # samples; with tensor parallelism, hands each step to the others
        self.channel = StepChannel(tp, device) if tp.size > 1 else None
        self._num_last_sampled = 0  # tokens the last step sampled (into last_sampled)
        # the engine's kernel choice, bound to every layer of its model (kernels/registry.py)
        self.kernels = kernels or default_kernels()
        bind_kernels(model, self.kernels)
        self.dtype = dtype
        self.kv_dtype = kv_dtype or dtype
        self.device = device
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.sampler = Sampler(self.kernels)
        self.kv_scale_calibration = False  # calibrate_kv_scales(): the next prompt step sets the FP8 KV scales
        self.decode_graphs: DecodeGraphs | None = None
        # decode steps of up to MAX_PREFETCH_SEQS rows prefetch weights (layers/prefetch.py; EngineConfig.prefetch_weights)
        self.weight_prefetch: WeightPrefetch | None = None
        self.piecewise_graphs: PiecewiseGraphs | None = None
        max_blocks = cdiv(max_model_len, block_size)
        self.batch = InputBatch(max_num_seqs, max_blocks, device)
        self.last_sampled = torch.zeros(max_num_seqs, dtype=torch.int64, device=device)
        max_tokens = max(max_num_batched_tokens, max_num_seqs)
        max_entries = max_num_seqs * max_blocks
        self.staging = StagingBuffer(64 * max_tokens + 128 * max_num_seqs + 24 * max_entries + 4096, device)

    def enable_decode_graphs(self, max_num_seqs: int, max_model_len: int, capture: bool = True) -> None:
        """Serve pure-decode steps of up to max_num_seqs sequences, sampling included, from CUDA/HIP
        graphs (cuda_graph.py); capture=False runs the same padded path eagerly (tests on CPU).
        Call after allocate_kv_cache."""
        self.decode_graphs = DecodeGraphs(self.staging, min(max_num_seqs, len(self.last_sampled)), self.batch.dummy_row)
        if capture:
            self.decode_graphs.capture(self._decode_body)

    def enable_piecewise_graphs(
        self, max_num_batched_tokens: int, capture: bool = True, first_size: int = 256, rope_kv_write: bool = False
    ) -> None:
        """Serve prefill and mixed steps of up to max_num_batched_tokens tokens from piecewise CUDA/HIP
        graphs: all but attention, which runs eagerly between them (piecewise_graph.py); capture=False
        runs the same padded path eagerly (tests on CPU). first_size: the smallest padded size;
        rope_kv_write: the layers' fused RoPE + KV write inside the graphs (else eager, with attention).
        Call after allocate_kv_cache; its graphs have their own memory pool, apart from decode graphs'."""
        self.piecewise_graphs = PiecewiseGraphs(
            self.model, max_num_batched_tokens, self.dtype, self.device, first_size, rope_kv_write
        )
        if capture:
            self.piecewise_graphs.capture(self.kv_caches)

    def kv_bytes_per_block(self) -> int:
        m = self.model
        return 2 * m.num_layers * self.block_size * m.num_kv_heads * m.head_dim * torch.finfo(self.kv_dtype).bits // 8

    def allocate_kv_cache(self, num_blocks: int) -> None:
        m = self.model
        shape = (m.num_layers, 2, num_blocks, self.block_size, m.num_kv_heads, m.head_dim)
        cache = torch.empty(shape, dtype=self.kv_dtype, device=self.device)
        self.kv_caches = [(cache[i, 0], cache[i, 1]) for i in range(m.num_layers)]
        if self.kv_dtype.itemsize == 1:
            # FP8 cache: per-layer K and V scales; the checkpoint's calibrated ones where it has them, else 1.0
            for attn in self.model.modules():
                if isinstance(attn, Attention):
                    scales = attn.checkpoint_kv_scales
                    attn.k_scale = torch.tensor([scales.get("k_scale", 1.0)], dtype=torch.float32, device=self.device)
                    attn.v_scale = torch.tensor([scales.get("v_scale", 1.0)], dtype=torch.float32, device=self.device)

    def calibrate_kv_scales(self) -> None:
        """calculate_kv_scales: the next step sets every layer's FP8 K and V scale to amax / fp8 max
        of that step's K and V. After start-up that step holds the first prompts, so it replays no
        decode graph and its attention runs eagerly and sees the flag; the scales are updated in
        place, so graphs captured before read the new values."""
        if self.kv_dtype.itemsize != 1:
            raise ValueError("calculate_kv_scales needs an FP8 KV cache: set kv_cache_dtype='fp8'")
        for attn in self.model.modules():
            if isinstance(attn, Attention):
                attn.k_scale.fill_(0.0)
                attn.v_scale.fill_(0.0)
        self.kv_scale_calibration = True

    def _set_kv_calibration(self, on: bool) -> None:
        for attn in self.model.modules():
            if isinstance(attn, Attention):
                attn.calibrate_kv_scales = on

    @torch.inference_mode()
    def profile_peak_bytes(self, max_num_batched_tokens: int, max_num_seqs: int) -> int:
        """Peak device memory of the largest step (weights included): a forward over
        `max_num_batched_tokens` tokens split into up to `max_num_seqs` prompts, plus their logits and
        sampling, against a scratch KV cache just big enough for it (freed afterwards)."""
        bs = self.block_size
        lens = profile_lens(max_num_batched_tokens, max_num_seqs, self.max_model_len)
        num_seqs, max_num_batched_tokens = len(lens), sum(lens)
        blocks_per_seq = [cdiv(n, bs) for n in lens]
        scratch = self.kv_caches
        self.allocate_kv_cache(sum(blocks_per_seq))
        table = torch.zeros(num_seqs, max(blocks_per_seq), dtype=torch.int32)
        slots, first = [], 0
        for i, (n, nb) in enumerate(zip(lens, blocks_per_seq)):
            table[i, :nb] = torch.arange(first, first + nb, dtype=torch.int32)
            slots.append(first * bs + torch.arange(n))
            first += nb
        meta = AttentionMetadata(
            slot_mapping=torch.cat(slots).to(self.device),
            block_tables=table.to(self.device),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=self.device),
            query_start_loc=torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=self.device),
            max_query_len=max(lens),
            max_seq_len=max(lens),
        )
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        ids = torch.randint(0, self.model.vocab_size, (max_num_batched_tokens,), device=self.device)
        positions = torch.cat([torch.arange(n) for n in lens]).to(self.device)
        hidden = self.model(ids, positions, self.kv_caches, meta)
        rows = (meta.query_start_loc[1:] - 1).long()
        logits = self.model.compute_logits(hidden[rows])
        ones = torch.ones(num_seqs, device=self.device)
        st = SamplingTensors(
            temperature=ones,
            top_k=torch.full((num_seqs,), 50, dtype=torch.int32, device=self.device),
            top_p=ones * 0.9,
            min_p=ones * 0.0,
            seeds=torch.arange(num_seqs, device=self.device),
            max_num_logprobs=None,
        )
        self.sampler(logits, st)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(self.device)
        kv_scratch_bytes = sum(k.numel() * k.element_size() * 2 for k, _ in self.kv_caches)
        self.kv_caches = scratch
        del hidden, logits
        torch.cuda.empty_cache()
        return peak - kv_scratch_bytes

    # Prefill/mixed step shapes that Triton specialises on differently: (query lengths of the
    # sequences) giving token and sequence counts equal to 1, divisible by 16, or neither.
    WARM_UP_SHAPES = ((32,), (37,), (32, 32, 32), (37, 40, 34), (32,) * 16, (37,) * 15 + (38,))

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Run a prefill-like forward, logits, sampling and log-probs at each WARM_UP_SHAPES shape
        (inputs that write no KV), so that Triton compiles the kernel variants of prefill and mixed
        steps now rather than during the first `generate`. Decode shapes compile at graph capture."""
        batch = self.batch
        for q_lens in self.WARM_UP_SHAPES:
            lens = torch.tensor(q_lens, dtype=torch.int32, device=self.device)
            num_tokens, num_seqs = sum(q_lens), len(q_lens)
            rows = torch.full((num_seqs,), batch.dummy_row, dtype=torch.int64, device=self.device)
            query_start = torch.zeros(num_seqs + 1, dtype=torch.int32, device=self.device)
            query_start[1:] = torch.cumsum(lens, 0)
            zeros = torch.zeros(num_tokens, dtype=torch.int64, device=self.device)
            hidden = self._forward(zeros, zeros, zeros - 1, None, rows, lens, query_start, max(q_lens), max(q_lens))
            logits = self.model.compute_logits(hidden[(query_start[1:] - 1).long()])
            self.sampler(logits, batch.sampling_tensors(rows, max_num_logprobs=2))
            self.kernels.log_softmax(self.model.compute_logits(hidden))
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    # ---- one step ------------------------------------------------------------------------

    def reset_batch(self) -> None:
        """Drop the persistent batch (the engine aborted every request after a failed step)."""
        self.batch.reset()

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> PendingStep:
        """Launch the scheduled step; returns at once (the tokens arrive through `result()`)."""
        batch = self.batch
        for request_id in sched.removed_ids:
            batch.remove(request_id)
        n = len(sched.scheduled)
        rows = np.empty(n, dtype=np.int64)
        starts = np.empty(n, dtype=np.int64)
        num_new = np.empty(n, dtype=np.int64)
        samples = np.zeros(n, dtype=bool)
        from_prev = np.zeros(n, dtype=bool)
        ids: list[int] = []
        sampled: list[Request] = []
        # indices into `sampled` of rows with logprobs, min_tokens, logit_bias, penalties or a structured output
        special: list[int] = []
        # penalized or structured rows with a token in flight: index into `sampled` -> its position in last_sampled
        in_flight: dict[int, int] = {}
        structured_in_flight = False
        prompt: list[tuple[int, Request]] = []
        row_of = batch.row_of
        for i, s in enumerate(sched.scheduled):
            r = s.request
            row = row_of.get(r.request_id)
            if row is None:
                row = batch.add(r)
            if s.new_block_ids:
                batch.append_blocks(row, s.new_block_ids)
            rows[i], starts[i], num_new[i] = row, s.start, s.num_new_tokens
            if s.start == r.num_tokens:  # its input is the token still in flight
                from_prev[i] = True
                ids.append(0)
            else:
                ids.extend(r.token_ids_range(s.start, s.start + s.num_new_tokens))
            if s.samples:
                samples[i] = True
                p = r.params
                if p.needs_special_sampling:
                    if from_prev[i] and (p.has_penalties or r.grammar):  # its last generated token, in last_sampled
                        in_flight[len(sampled)] = int(batch.sample_pos[row])
                        structured_in_flight |= r.grammar is not None
                    special.append(len(sampled))
                sampled.append(r)
            if r.params.prompt_logprobs is not None:
                prompt.append((i, r))

        num_tokens, num_sampled = len(ids), len(sampled)
        query_start = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(num_new, out=query_start[1:])
        if num_tokens == n:
            positions, token_rows = starts, rows
        else:
            positions = np.arange(num_tokens, dtype=np.int64) - np.repeat(query_start[:-1] - starts, num_new)
            token_rows = np.repeat(rows, num_new)
        bs = self.block_size
        slots = batch.table_np[token_rows, positions // bs].astype(np.int64) * bs + positions % bs
        prev_src = np.full(num_tokens, -1, dtype=np.int64)
        prev_src[query_start[:-1][from_prev]] = batch.sample_pos[rows[from_prev]]
        seq_lens = (starts + num_new).astype(np.int32)
        sample_rows = rows[samples]
        batch.sample_pos[sample_rows] = np.arange(num_sampled)
        # the prompt log-probs each request's rows give: (request, first position, last, first hidden row)
        spans = [(r, *self._prompt_span(r, int(query_start[i]), int(starts[i]), int(num_new[i]))) for i, r in prompt]
        prev_tokens = self._num_last_sampled if from_prev.any() else 0
        self._num_last_sampled = num_sampled

        # the penalized and structured rows' tokens in flight, read before this step's sampling overwrites last_sampled
        flight = self._in_flight_tokens(in_flight, structured_in_flight)

        staging = self.staging
        staging.begin()
        graphs = self.decode_graphs
        use_graph = graphs is not None and num_tokens == n == num_sampled and n <= graphs.max_batch
        entries = batch.take_entries()
        prompt_lp: list[tuple[Request, int, LogprobTensors | None]] = []
        if use_graph:
            size = graphs.padded_size(n)
            pad = size - n
            padded = lambda a, fill: np.concatenate([a, np.full(pad, fill, dtype=a.dtype)]) if pad else a
            in_graph = graph_entries(entries, size)
            e_rows, e_cols, e_vals = in_graph or (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int32))
            fill_e = size - len(e_rows)
            dummy = batch.dummy_row
            values = {
                "input_ids": padded(np.asarray(ids, dtype=np.int64), 0),
                "positions": padded(positions, 0),
                "slot_mapping": padded(slots, -1),
                "prev_src": padded(prev_src, -1),
                "rows": padded(rows, dummy),
                "entry_rows": np.concatenate([e_rows, np.full(fill_e, dummy, dtype=np.int64)]),
                "entry_cols": np.concatenate([e_cols, np.zeros(fill_e, dtype=np.int64)]),
                "entry_vals": np.concatenate([e_vals, np.zeros(fill_e, dtype=np.int32)]),
                "seq_lens": padded(seq_lens, 1),
                "query_start_loc": np.arange(size + 1, dtype=np.int32),
            }
            for name, _, _ in DECODE_LAYOUT:
                staging.put(values[name])
            extra = self._put_batch_updates(None if in_graph is not None else entries)
            views = staging.send()
            header = StepHeader(graph_size=size, num_seqs=n, num_sampled=n, relogits=bool(special),
                                prev_tokens=prev_tokens, has_entries=extra[0], has_rows=extra[1])  # fmt: skip
            self._share_step(header, [])
            self._apply_batch_updates(views[len(DECODE_LAYOUT) :], extra)
            hidden = graphs.run(size, self._decode_body)
            tokens, lp = None, None
            if special:  # logprobs or adjusted logits (SamplingParams.needs_special_sampling): sample again, eagerly
                logits = self.model.compute_logits(hidden[:n])
                tokens, lp = self._sample(logits, views[_DECODE_ROWS][:n], sampled, special, flight, advance=False)
        else:
            arrays = {
                "input_ids": np.asarray(ids, dtype=np.int64),
                "positions": positions,
                "slot_mapping": slots,
                "prev_src": prev_src,
                "rows": rows,
                "sample_idx": (query_start[1:][samples] - 1).astype(np.int64),
                "sample_rows": sample_rows,
                "seq_lens": seq_lens,
                "query_start_loc": query_start,
            }
            names = eager_slot_names(bool(from_prev.any()))
            for name in names:
                staging.put(arrays[name])
            extra = self._put_batch_updates(entries)
            views = staging.send()
            header = StepHeader(
                num_seqs=n, num_sampled=num_sampled, max_query_len=int(num_new.max()) if n else 0,
                max_seq_len=int(seq_lens.max()) if n else 0, piecewise=self._fits_piecewise(num_tokens),
                calibrating=self.kv_scale_calibration and num_tokens > 0, prev_tokens=prev_tokens,
                has_prev_src=bool(from_prev.any()), has_entries=extra[0], has_rows=extra[1],
            )  # fmt: skip
            self._share_step(header, spans)
            hidden, v = self._eager_step(header, views, names)
            tokens, lp = None, None
            if num_sampled:
                logits = self.model.compute_logits(hidden[v["sample_idx"]])
                tokens, lp = self._sample(logits, v["sample_rows"], sampled, special, flight, advance=True)
            prompt_lp = [self._prompt_logprobs(hidden, *span) for span in spans]
        if tokens is not None:
            self.last_sampled[:num_sampled].copy_(tokens)
        host_tokens = to_host(self.last_sampled[:num_sampled])
        ks = None
        if lp is not None:
            ks = [r.params.logprobs for r in sampled]
            lp = lp.to_host()
        prompt_host = [(r, first, t.to_host()) for r, first, t in prompt_lp if t is not None]
        done = None
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        return PendingStep(sampled, host_tokens, ks, lp, prompt_host, done)

    def _share_step(self, header: StepHeader, spans: list[tuple[Request, int, int, int]]) -> None:
        """Tensor parallelism, the driver: hand the staged step to the followers (with the hidden rows
        of its prompt log-probs, `spans` as _prompt_span's), then the tokens of the step before that
        its inputs read (the followers do not sample)."""
        if self.channel is None:
            return
        rows = [(row, row + last - first) for _, first, last, row in spans if last > first]
        self.channel.send(header, self.staging, np.array(rows, dtype=np.int64).reshape(-1, 2))
        if header.prev_tokens:
            self.tp.broadcast(self.last_sampled[: header.prev_tokens])

    def _eager_step(
        self, header: StepHeader, views: list[torch.Tensor], names: list[str]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """An eager step's device work up to the hidden states, on every rank: the batch's pending
        updates, then the forward. Returns (hidden states, the step's named input views)."""
        self._apply_batch_updates(views[len(names) :], (header.has_entries, header.has_rows))
        v = dict(zip(names, views))
        # the first step after start-up (its prompts) sets the FP8 KV scales (calculate_kv_scales)
        if header.calibrating:
            self._set_kv_calibration(True)
        hidden = self._forward(
            v["input_ids"], v["positions"], v["slot_mapping"], v.get("prev_src"), v["rows"], v["seq_lens"],
            v["query_start_loc"], header.max_query_len, header.max_seq_len, piecewise=header.piecewise,
        )  # fmt: skip
        if header.calibrating:
            self._set_kv_calibration(False)
            self.kv_scale_calibration = False
        return hidden, v

    @torch.inference_mode()
    def follow_step(self) -> bool:
        """A follower (tensor-parallel rank > 0): run the next step the driver broadcasts, computing
        logits wherever it does (their all-gather needs every rank); False when the driver stops."""
        received = self.channel.receive(self.staging)
        if received is None:
            return False
        header, views, row_spans = received
        if header.prev_tokens:
            self.tp.broadcast(self.last_sampled[: header.prev_tokens])
        if header.graph_size:
            self._apply_batch_updates(views[len(DECODE_LAYOUT) :], (header.has_entries, header.has_rows))
            hidden = self.decode_graphs.run(header.graph_size, self._decode_body)
            if header.relogits:
                self.model.compute_logits(hidden[: header.num_seqs])
            return True
        hidden, v = self._eager_step(header, views, eager_slot_names(header.has_prev_src))
        if header.num_sampled:
            self.model.compute_logits(hidden[v["sample_idx"]])
        for lo, hi in row_spans.tolist():
            for first in range(lo, hi, PROMPT_LOGPROBS_ROWS):
                self.model.compute_logits(hidden[first : min(first + PROMPT_LOGPROBS_ROWS, hi)])
        return True

    def _put_batch_updates(self, entries) -> tuple[bool, bool]:
        """Stage the persistent batch's pending changes: block-table entries (unless a graph applies
        them) and new rows' sampling parameters. Returns which were staged."""
        if entries is not None:
            for a in entries:
                self.staging.put(a)
        new_rows = self.batch.take_new_rows()
        if new_rows is not None:
            for a in new_rows:
                self.staging.put(a.reshape(-1))
        return entries is not None, new_rows is not None

    def _apply_batch_updates(self, views: list[torch.Tensor], staged: tuple[bool, bool]) -> None:
        has_entries, has_rows = staged
        if has_entries:
            self.batch.apply_entries(*views[:3])
            views = views[3:]
        if has_rows:
            self.batch.apply_new_rows(*views[:5])

    def _forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        prev_src: torch.Tensor | None,
        rows: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        max_query_len: int,
        max_seq_len: int,
        piecewise: bool = False,
        block_tables: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The forward pass over staged inputs: eager (device work only: capturable), or through the
        piecewise graphs (`piecewise`: see _fits_piecewise). `block_tables`: the rows' tables, gathered
        already (decode graphs: kernels/step_inputs.py), else gathered here."""
        if prev_src is not None:  # tokens sampled by the step before, still on the device
            input_ids = torch.where(prev_src >= 0, self.last_sampled[prev_src.clamp(min=0)], input_ids)
        meta = AttentionMetadata(
            slot_mapping=slot_mapping,
            block_tables=self.batch.block_table[rows] if block_tables is None else block_tables,
            seq_lens=seq_lens,
            query_start_loc=query_start_loc,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
        )
        if piecewise:
            return self.piecewise_graphs.run(input_ids, positions, self.kv_caches, meta)
        return self.model(input_ids, positions, self.kv_caches, meta)

    def _fits_piecewise(self, num_tokens: int) -> bool:
        """Whether a step of num_tokens tokens runs through the piecewise graphs (larger ones, eagerly)."""
        graphs = self.piecewise_graphs
        return graphs is not None and 0 < num_tokens <= graphs.max_tokens

    def _decode_body(self, size: int, v: dict[str, torch.Tensor]) -> torch.Tensor:
        """What a decode graph of `size` rows runs: block-table entries, forward, logits and sampling
        (tokens into last_sampled). Returns the hidden states."""
        input_ids, prev_src, tables = v["input_ids"], v["prev_src"], None
        if step_inputs.ENABLED:  # the block-table entries, the tokens in flight and the rows' tables: one launch
            input_ids, tables = step_inputs.decode_inputs(
                input_ids, prev_src, self.last_sampled, v["rows"], self.batch.block_table, v["entry_rows"],
                v["entry_cols"], v["entry_vals"],
            )  # fmt: skip
            prev_src = None
        else:
            self.batch.apply_entries(v["entry_rows"], v["entry_cols"], v["entry_vals"])
        prefetch = self.weight_prefetch
        with prefetch.decode() if prefetch is not None and size <= MAX_PREFETCH_SEQS else contextlib.nullcontext():
            hidden = self._forward(input_ids, v["positions"], v["slot_mapping"], prev_src, v["rows"], v["seq_lens"],
                                   v["query_start_loc"], 1, self.max_model_len, block_tables=tables)  # fmt: skip
        logits = self.model.compute_logits(hidden)
        if self.is_driver:  # followers compute the logits (a collective) but do not sample
            tokens, _ = self.sampler(logits, self.batch.sampling_tensors(v["rows"]))
            self.last_sampled[:size].copy_(tokens)
        return hidden

    def _in_flight_tokens(self, in_flight: dict[int, int], copy_back: bool) -> InFlight | None:
        """The tokens still in flight of the penalized and structured rows (indices into `sampled`); copy_back:
        copied back too (a structured row's matcher needs them), without waiting: the step's forward is launched
        before the sampling reads them (InFlight.host_tokens)."""
        if not in_flight:
            return None
        positions = torch.tensor(list(in_flight.values()), dtype=torch.int64).to(self.device, non_blocking=True)
        tokens = self.last_sampled[positions]
        if not copy_back:
            return InFlight(list(in_flight), tokens)
        host, ready = to_host(tokens), None
        if tokens.is_cuda:
            ready = torch.cuda.Event()
            ready.record()
        return InFlight(list(in_flight), tokens, host, ready)

    def _sample(
        self,
        logits: torch.Tensor,
        rows: torch.Tensor,
        sampled: list[Request],
        special: list[int],
        flight: InFlight | None,
        advance: bool,
    ) -> tuple[torch.Tensor, LogprobTensors | None]:
        want = [sampled[i].params.logprobs for i in special if sampled[i].params.logprobs is not None]
        st = self.batch.sampling_tensors(rows, max(want) if want else None, advance=advance)
        st.adjust = logit_adjustments(sampled, special, flight, logits.shape[-1], self.device)
        return self.sampler(logits, st)

    @staticmethod
    def _prompt_span(r: Request, row0: int, start: int, count: int) -> tuple[int, int, int]:
        """(first, last, first hidden row) of the prompt positions a chunk of `count` tokens from
        position `start` (hidden rows from row0) gives log-probs for: position p predicts token p + 1;
        those delivered before a preemption are skipped."""
        first = max(start, len(r.prompt_logprobs) - 1)  # prompt_logprobs starts as [None]
        last = min(start + count, r.num_prompt_tokens - 1)
        return first, last, row0 + first - start

    def _prompt_logprobs(
        self, hidden: torch.Tensor, r: Request, first: int, last: int, row: int
    ) -> tuple[Request, int, LogprobTensors | None]:
        """Logprobs of the prompt tokens at positions first + 1..last (hidden rows from `row`)."""
        if last <= first:
            return r, first + 1, None
        targets = torch.tensor(r.prompt_token_ids[first + 1 : last + 1], device=self.device)
        # in slices of PROMPT_LOGPROBS_ROWS: float32 logits and their log-softmax are [rows, vocab] each
        # (4 GB at 8,192 x 128k), which the profiling step that sized the KV cache never saw
        parts = []
        for lo in range(first, last, PROMPT_LOGPROBS_ROWS):
            hi = min(lo + PROMPT_LOGPROBS_ROWS, last)
            logits = self.model.compute_logits(hidden[row + lo - first : row + hi - first])
            parts.append(top_logprobs(self.kernels.log_softmax(logits), targets[lo - first : hi - first],
                                      r.params.prompt_logprobs))  # fmt: skip
            del logits
        if len(parts) == 1:
            return r, first + 1, parts[0]
        names = [f.name for f in dataclasses.fields(LogprobTensors)]
        top = LogprobTensors(*(torch.cat([getattr(part, name) for part in parts]) for name in names))
        return r, first + 1, top
