"""How rank 0 hands each step to the other tensor-parallel ranks: by broadcast, not pickled requests.

Rank 0's model runner turns the scheduler's output into a few small arrays packed into its
staging buffer (worker/staging.py); the followers need exactly those, plus a handful of integers
(`StepHeader`), to run the same forward and the same collectives. A step is three broadcasts from
rank 0: the header (fixed length), the staged arrays' slots (offset, length, dtype) and the prompt
log-prob row spans, then the staged bytes themselves, received straight into the follower's own
staging buffer at the same offsets (so its decode graphs read them where they were captured).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from tritonllm.distributed.parallel_state import TensorParallel
from tritonllm.worker.staging import StagingBuffer

_SLOT_DTYPES = (torch.int64, torch.int32, torch.float32, torch.bool, torch.uint8)
_STOP, _STEP = 0, 1


@dataclass
class StepHeader:
    """What a follower needs besides the staged arrays to run the step rank 0 launched."""

    graph_size: int = 0  # the padded size of the decode graph the step replays; 0: an eager step
    num_seqs: int = 0
    num_sampled: int = 0  # rows whose logits are computed (eager: the staged sample_idx)
    max_query_len: int = 0
    max_seq_len: int = 0
    piecewise: bool = False
    calibrating: bool = False  # the step sets the FP8 KV scales (calculate_kv_scales)
    relogits: bool = False  # a graph step whose logits are computed again, eagerly (logprobs, min_tokens)
    prev_tokens: int = 0  # the inputs read this many tokens the step before sampled: rank 0 broadcasts them
    has_prev_src: bool = False  # staged slots present (see ModelRunner's step layouts)
    has_entries: bool = False
    has_rows: bool = False


_FIELDS = [f.name for f in dataclasses.fields(StepHeader)]
_HEADER_LEN = 4 + len(_FIELDS)  # kind, staged bytes, slots, spans, then the fields


class StepChannel:
    def __init__(self, tp: TensorParallel, device: torch.device) -> None:
        self.tp = tp
        self.device = device
        self._header = torch.zeros(_HEADER_LEN, dtype=torch.int64, device=device)

    def send(self, header: StepHeader, staging: StagingBuffer, spans: np.ndarray) -> None:
        """Rank 0: broadcast the step whose arrays `staging` holds (sent to its device already);
        `spans` int64 [k, 2]: the hidden-state row ranges whose prompt log-probs the step computes."""
        slots = staging.packed_slots
        nbytes = staging.packed_bytes
        values = [_STEP, nbytes, len(slots), len(spans), *(int(getattr(header, name)) for name in _FIELDS)]
        self._header.copy_(torch.tensor(values, dtype=torch.int64))
        self.tp.broadcast(self._header)
        table = [(start, size, _SLOT_DTYPES.index(dtype)) for start, size, dtype in slots]
        meta = np.concatenate([np.asarray(table, dtype=np.int64).reshape(-1), spans.reshape(-1).astype(np.int64)])
        self.tp.broadcast(torch.from_numpy(meta).to(self.device))
        if nbytes:
            self.tp.broadcast(staging.device_buffer[:nbytes])

    def send_stop(self) -> None:
        self._header.zero_()
        self.tp.broadcast(self._header)

    def receive(self, staging: StagingBuffer) -> tuple[StepHeader, list[torch.Tensor], np.ndarray] | None:
        """A follower: the next step (its header, the device views of its staged arrays, its prompt
        log-prob spans), or None when rank 0 stops."""
        self.tp.broadcast(self._header)
        kind, nbytes, num_slots, num_spans, *fields = self._header.tolist()
        if kind == _STOP:
            return None
        meta = torch.empty(3 * num_slots + 2 * num_spans, dtype=torch.int64, device=self.device)
        self.tp.broadcast(meta)
        meta = meta.cpu().numpy()
        if nbytes:
            self.tp.broadcast(staging.device_buffer[:nbytes])
        table = meta[: 3 * num_slots].reshape(-1, 3)
        views = [staging.view(int(start), int(size), _SLOT_DTYPES[code]) for start, size, code in table]
        header = StepHeader(**{name: type(getattr(StepHeader, name))(v) for name, v in zip(_FIELDS, fields)})
        return header, views, meta[3 * num_slots :].reshape(-1, 2)
