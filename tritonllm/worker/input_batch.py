"""The model runner's persistent batch: one row per request in the batch, kept across steps.

A row holds what changes only when the batch changes: the request's block table (a host numpy
copy and a device one, grown by the scheduler's new block ids), its sampling parameters, its seed
base and how many tokens it has sampled (device tensors). A step's host work is then a few
vectorised numpy operations over row indices, and the device gathers its block tables and
sampling parameters by row; nothing is rebuilt per request per step. Changes (new rows'
parameters, new block-table entries) reach the device with the next step's staged inputs.

Row `dummy_row` (the last) stays all zeros and greedy: padded rows of a CUDA graph read it and
write their block-table entries into it.
"""

from __future__ import annotations

import numpy as np
import torch

from tritonllm.engine.request import Request
from tritonllm.kernels import step_inputs
from tritonllm.kernels.step_inputs import SEED_MASK, SEED_MUL, STEP_MUL
from tritonllm.layers.sampler import SamplingTensors


def step_seed(base_seed: int, step: int) -> int:
    """The seed of one request's `step`-th sampled token: a reproducible mix of both."""
    return (base_seed * SEED_MUL + (step + 1) * STEP_MUL) & SEED_MASK


def step_seeds(base_seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """`step_seed` elementwise on int64 tensors: the multipliers as two's-complement int64, products
    wrapping mod 2^64, give the same masked result."""
    return (base_seeds * (SEED_MUL - (1 << 64)) + (steps + 1) * (STEP_MUL - (1 << 64))) & SEED_MASK


class InputBatch:
    def __init__(self, max_num_seqs: int, max_blocks_per_seq: int, device: torch.device) -> None:
        rows = max_num_seqs + 1
        self.dummy_row = max_num_seqs
        self.max_blocks_per_seq = max_blocks_per_seq
        self.table_np = np.zeros((rows, max_blocks_per_seq), dtype=np.int32)
        self.num_blocks = np.zeros(rows, dtype=np.int64)
        # each row's index among the tokens sampled by the last step launched (its in-flight token)
        self.sample_pos = np.full(rows, -1, dtype=np.int64)
        self.block_table = torch.zeros((rows, max_blocks_per_seq), dtype=torch.int32, device=device)
        self.float_params = torch.zeros((3, rows), dtype=torch.float32, device=device)  # temperature, top_p, min_p
        self.float_params[1] = 1.0
        self.top_k = torch.zeros(rows, dtype=torch.int32, device=device)
        self.base_seed = torch.zeros(rows, dtype=torch.int64, device=device)
        self.num_sampled = torch.zeros(rows, dtype=torch.int64, device=device)
        self.reset()

    def reset(self) -> None:
        """Forget every row (also after a failed step: the device tensors keep stale values nobody reads)."""
        self.row_of: dict[str, int] = {}
        self._free_rows = list(range(self.dummy_row - 1, -1, -1))
        self.num_blocks[:] = 0
        self._entries: list[tuple[int, int, list[int]]] = []  # (row, first column, block ids) not on the device yet
        self._new_rows: list[tuple[int, Request]] = []

    def __len__(self) -> int:
        return len(self.row_of)

    def add(self, request: Request) -> int:
        """A row for a request entering the batch (new, or resumed after preemption)."""
        if not self._free_rows:
            raise RuntimeError(f"the batch is full ({self.dummy_row} rows): more running requests than max_num_seqs")
        row = self._free_rows.pop()
        self.row_of[request.request_id] = row
        self.num_blocks[row] = 0
        self._new_rows.append((row, request))
        return row

    def remove(self, request_id: str) -> None:
        row = self.row_of.pop(request_id, None)
        if row is not None:
            self._free_rows.append(row)

    def append_blocks(self, row: int, block_ids: list[int]) -> None:
        first = int(self.num_blocks[row])
        end = first + len(block_ids)
        self.table_np[row, first:end] = block_ids
        self.num_blocks[row] = end
        self._entries.append((row, first, block_ids))

    def take_entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The block-table entries added since the last call, as (rows, columns, block ids)."""
        if not self._entries:
            return None
        counts = [len(ids) for _, _, ids in self._entries]
        rows = np.repeat(np.array([r for r, _, _ in self._entries], dtype=np.int64), counts)
        starts = np.repeat(np.array([c for _, c, _ in self._entries], dtype=np.int64), counts)
        first_entry = np.repeat(np.cumsum([0, *counts[:-1]]), counts)
        cols = starts + np.arange(len(rows)) - first_entry
        vals = np.concatenate([np.asarray(ids, dtype=np.int32) for _, _, ids in self._entries])
        self._entries = []
        return rows, cols, vals

    def take_new_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """Parameters of the rows added since the last call: (rows, [3, n] temperature/top_p/min_p,
        top_k, seed bases, tokens sampled so far)."""
        if not self._new_rows:
            return None
        rows = np.array([row for row, _ in self._new_rows], dtype=np.int64)
        reqs = [r for _, r in self._new_rows]
        floats = np.array(
            [[r.params.temperature for r in reqs], [r.params.top_p for r in reqs], [r.params.min_p for r in reqs]],
            dtype=np.float32,
        )
        # a top_k beyond the vocabulary keeps every token: clipped to int32 (the device's dtype)
        top_k = np.array([min(r.params.top_k, 2**31 - 1) for r in reqs], dtype=np.int32)
        seeds = np.array([r.seed for r in reqs], dtype=np.int64)
        num_sampled = np.array([len(r.output_token_ids) for r in reqs], dtype=np.int64)
        self._new_rows = []
        return rows, floats, top_k, seeds, num_sampled

    # ---- on the device (capturable: no host synchronisation) -----------------------------

    def apply_entries(self, rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor) -> None:
        self.block_table.index_put_((rows, cols), vals)

    def apply_new_rows(
        self, rows: torch.Tensor, floats: torch.Tensor, top_k: torch.Tensor, seeds: torch.Tensor, sampled: torch.Tensor
    ) -> None:
        self.float_params.index_copy_(1, rows, floats.view(3, -1))
        self.top_k.index_copy_(0, rows, top_k)
        self.base_seed.index_copy_(0, rows, seeds)
        self.num_sampled.index_copy_(0, rows, sampled)

    def sampling_tensors(
        self, rows: torch.Tensor, max_num_logprobs: int | None = None, advance: bool = True
    ) -> SamplingTensors:
        """The sampling parameters of these rows with this step's seeds, advancing the rows' sampled
        counts (advance=False: the step's counts are advanced already, sampling again)."""
        if step_inputs.ENABLED:  # one launch: step_seeds of each row's count, the count advanced
            temperature, top_p, min_p, top_k, seeds = step_inputs.sampling_params(
                rows, self.float_params, self.top_k, self.base_seed, self.num_sampled, advance
            )
        else:
            floats = self.float_params[:, rows]
            temperature, top_p, min_p, top_k = floats[0], floats[1], floats[2], self.top_k[rows]
            if advance:
                steps = self.num_sampled[rows]
                self.num_sampled.index_copy_(0, rows, steps + 1)
            else:
                steps = self.num_sampled[rows] - 1
            seeds = step_seeds(self.base_seed[rows], steps)
        return SamplingTensors(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seeds=seeds,
            max_num_logprobs=max_num_logprobs,
        )
