"""Runs one scheduled step on the device: batch metadata, forward pass, logits, sampling.

The scheduler's `SchedulerOutput` becomes device tensors once per step (one host-to-device copy
each); layers never see requests. Owns the KV cache tensors: per layer K and V, each
[num_blocks, block_size, num_kv_heads, head_dim].
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from tritonllm.engine.kv_cache import KVCacheManager, cdiv
from tritonllm.engine.request import Request
from tritonllm.engine.scheduler import SchedulerOutput
from tritonllm.kernels import ops
from tritonllm.layers.attention import Attention, AttentionMetadata
from tritonllm.layers.sampler import Sampler, SamplingTensors, TopLogprobs, top_logprobs
from tritonllm.worker.cuda_graph import DecodeGraphs

_SEED_MASK = (1 << 62) - 1


def step_seed(base_seed: int, step: int) -> int:
    """The seed of one request's `step`-th sampled token: a reproducible mix of both."""
    return (base_seed * 0x9E3779B97F4A7C15 + (step + 1) * 0xBF58476D1CE4E5B9) & _SEED_MASK


@dataclass
class StepResult:
    """What one step produced, on the host, keyed by request id."""

    sampled: dict[str, int] = field(default_factory=dict)
    sampled_logprobs: dict[str, tuple[list[int], list[float], float, int]] = field(default_factory=dict)
    # request id -> (first prompt position covered, TopLogprobs of consecutive prompt positions)
    prompt_logprobs: dict[str, tuple[int, TopLogprobs]] = field(default_factory=dict)


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        dtype: torch.dtype,
        device: torch.device,
        block_size: int,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.dtype = dtype
        self.kv_dtype = kv_dtype or dtype
        self.device = device
        self.block_size = block_size
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.sampler = Sampler()
        self.decode_graphs: DecodeGraphs | None = None

    def enable_decode_graphs(self, max_num_seqs: int, max_model_len: int, capture: bool = True) -> None:
        """Serve pure-decode steps of up to max_num_seqs sequences from CUDA/HIP graphs (see
        cuda_graph.py); capture=False runs the same padded path eagerly (tests on CPU). Call after
        allocate_kv_cache."""
        self.decode_graphs = DecodeGraphs(self.model, self.kv_caches, max_num_seqs, max_model_len, self.block_size,
                                          self.device, capture)  # fmt: skip

    def kv_bytes_per_block(self) -> int:
        m = self.model
        return 2 * m.num_layers * self.block_size * m.num_kv_heads * m.head_dim * torch.finfo(self.kv_dtype).bits // 8

    def allocate_kv_cache(self, num_blocks: int) -> None:
        m = self.model
        shape = (m.num_layers, 2, num_blocks, self.block_size, m.num_kv_heads, m.head_dim)
        cache = torch.empty(shape, dtype=self.kv_dtype, device=self.device)
        self.kv_caches = [(cache[i, 0], cache[i, 1]) for i in range(m.num_layers)]
        if self.kv_dtype.itemsize == 1:
            # FP8 cache: per-layer K and V scales; 1.0 unless a checkpoint provides calibrated ones
            for attn in self.model.modules():
                if isinstance(attn, Attention):
                    attn.k_scale = torch.ones(1, dtype=torch.float32, device=self.device)
                    attn.v_scale = torch.ones(1, dtype=torch.float32, device=self.device)

    @torch.inference_mode()
    def profile_peak_bytes(self, max_num_batched_tokens: int, max_num_seqs: int) -> int:
        """Peak device memory of the largest step (weights included): a forward over
        `max_num_batched_tokens` tokens split into up to `max_num_seqs` prompts, plus their logits and
        sampling, against a scratch KV cache just big enough for it (freed afterwards)."""
        bs = self.block_size
        num_seqs = max(1, min(max_num_seqs, max_num_batched_tokens))
        lens = [max_num_batched_tokens // num_seqs] * num_seqs
        lens[-1] += max_num_batched_tokens - sum(lens)
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
            banned_rows=None,
            banned_tokens=None,
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

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput, kv_cache: KVCacheManager) -> StepResult:
        bs = self.block_size
        ids: list[int] = []
        positions: list[np.ndarray] = []
        slots: list[np.ndarray] = []
        seq_lens: list[int] = []
        query_start = [0]
        tables: list[list[int]] = []
        sample_rows: list[int] = []
        prompt_rows: list[tuple[Request, int, int, int]] = []  # (request, first row, first position, count)
        for s in sched.scheduled:
            r = s.request
            start, end = r.num_computed_tokens, r.num_computed_tokens + s.num_new_tokens
            row0 = query_start[-1]
            ids.extend(r.token_ids_range(start, end))
            pos = np.arange(start, end, dtype=np.int64)
            blocks = np.asarray(kv_cache.block_ids(r.request_id), dtype=np.int64)
            positions.append(pos)
            slots.append(blocks[pos // bs] * bs + pos % bs)
            seq_lens.append(end)
            query_start.append(row0 + s.num_new_tokens)
            tables.append(kv_cache.block_ids(r.request_id))
            if s.samples:
                sample_rows.append(query_start[-1] - 1)
            if r.params.prompt_logprobs is not None:
                # row of position p predicts prompt token p + 1; keep those not computed before
                first = max(start, len(r.prompt_logprobs) - 1)  # prompt_logprobs starts as [None]
                last = min(end, r.num_prompt_tokens - 1)
                if last > first:
                    prompt_rows.append((r, row0 + first - start, first + 1, last - first))

        max_blocks = max(len(t) for t in tables)
        table_np = np.zeros((len(tables), max_blocks), dtype=np.int32)
        for i, t in enumerate(tables):
            table_np[i, : len(t)] = t
        to_dev = lambda a, dt: torch.from_numpy(np.asarray(a)).to(device=self.device, dtype=dt, non_blocking=True)
        graphs = self.decode_graphs
        if graphs is not None and len(ids) == len(seq_lens) <= graphs.max_batch:  # one new token each
            hidden = graphs.run(np.asarray(ids, dtype=np.int64), np.concatenate(positions), np.concatenate(slots),
                                table_np, np.asarray(seq_lens, dtype=np.int32))  # fmt: skip
        else:
            hidden = self._forward_eager(ids, positions, slots, table_np, seq_lens, query_start, sched, to_dev)
        return self._sample(sched, hidden, sample_rows, prompt_rows, to_dev)

    def _forward_eager(
        self,
        ids: list[int],
        positions: list[np.ndarray],
        slots: list[np.ndarray],
        table_np: np.ndarray,
        seq_lens: list[int],
        query_start: list[int],
        sched: SchedulerOutput,
        to_dev: Callable[[object, torch.dtype], torch.Tensor],
    ) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=to_dev(np.concatenate(slots), torch.int64),
            block_tables=to_dev(table_np, torch.int32),
            seq_lens=to_dev(np.asarray(seq_lens, dtype=np.int32), torch.int32),
            query_start_loc=to_dev(np.asarray(query_start, dtype=np.int32), torch.int32),
            max_query_len=max(s.num_new_tokens for s in sched.scheduled),
            max_seq_len=max(seq_lens),
        )
        input_ids = to_dev(np.asarray(ids, dtype=np.int64), torch.int64)
        return self.model(input_ids, to_dev(np.concatenate(positions), torch.int64), self.kv_caches, meta)

    def _sample(
        self,
        sched: SchedulerOutput,
        hidden: torch.Tensor,
        sample_rows: list[int],
        prompt_rows: list[tuple[Request, int, int, int]],
        to_dev: Callable[[object, torch.dtype], torch.Tensor],
    ) -> StepResult:
        result = StepResult()
        sampling = [s.request for s in sched.scheduled if s.samples]
        if sampling:
            logits = self.model.compute_logits(hidden[to_dev(sample_rows, torch.int64)])
            tokens, top = self.sampler(logits, self._sampling_tensors(sampling))
            for i, r in enumerate(sampling):
                result.sampled[r.request_id] = tokens[i]
                if top is not None and r.params.logprobs is not None:
                    k = r.params.logprobs
                    result.sampled_logprobs[r.request_id] = (
                        top.top_ids[i][:k],
                        top.top_logprobs[i][:k],
                        top.token_logprobs[i],
                        top.token_ranks[i],
                    )
        for request, row0, first_pos, count in prompt_rows:
            logits = self.model.compute_logits(hidden[row0 : row0 + count])
            targets = torch.tensor(request.prompt_token_ids[first_pos : first_pos + count], device=self.device)
            top = top_logprobs(ops.log_softmax(logits), targets, request.params.prompt_logprobs)
            result.prompt_logprobs[request.request_id] = (first_pos, top)
        return result

    def _sampling_tensors(self, requests: list[Request]) -> SamplingTensors:
        banned_rows: list[int] = []
        banned_tokens: list[int] = []
        for row, r in enumerate(requests):
            if len(r.output_token_ids) < r.params.min_tokens:
                stops = set(r.params.stop_token_ids) | (set() if r.params.ignore_eos else set(r.eos_token_ids))
                banned_rows.extend([row] * len(stops))
                banned_tokens.extend(sorted(stops))
        want_logprobs = [r.params.logprobs for r in requests if r.params.logprobs is not None]
        dev = lambda values, dt: torch.tensor(values, dtype=dt).to(self.device, non_blocking=True)
        return SamplingTensors(
            temperature=dev([r.params.temperature for r in requests], torch.float32),
            top_k=dev([r.params.top_k for r in requests], torch.int32),
            top_p=dev([r.params.top_p for r in requests], torch.float32),
            min_p=dev([r.params.min_p for r in requests], torch.float32),
            seeds=dev([step_seed(r.seed, len(r.output_token_ids)) for r in requests], torch.int64),
            banned_rows=dev(banned_rows, torch.int64) if banned_rows else None,
            banned_tokens=dev(banned_tokens, torch.int64) if banned_rows else None,
            max_num_logprobs=max(want_logprobs) if want_logprobs else None,
        )
