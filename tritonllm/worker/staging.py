"""One host-to-device copy per step: a step's small input arrays packed into a pinned host buffer.

Each array is placed at the next 16-byte boundary, so the same sequence of array lengths always
gives the same offsets: a CUDA graph captured over the views of one layout (decode graphs of one
padded size) reads the inputs that a later step packs in that layout. 16 bytes, not 8: Triton
specialises a kernel on whether each pointer is 16-byte aligned, so 8-byte slots made the kernels
see seq_lens / query_start_loc aligned or not depending on the step's array lengths, and compile a
new variant mid-serving (a 1.6 s step on the H200, scripts/find_jit_compiles.py, 2026-12-02). Two host buffers take turns,
so packing step N+1 never overwrites what step N's copy still reads (overlap scheduling); a turn
waits for the copy that last used its buffer. The device buffer is read in stream order by the
kernels of the step that filled it, before the next step's copy lands.
"""

from __future__ import annotations

import numpy as np
import torch

_ALIGN = 16


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


class StagingBuffer:
    def __init__(self, capacity_bytes: int, device: torch.device) -> None:
        self.capacity = _aligned(capacity_bytes)
        self.device = device
        pin = device.type != "cpu"
        self.device_buffer = torch.empty(self.capacity, dtype=torch.uint8, device=device)
        self._host = [torch.empty(self.capacity, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
        self._host_np = [h.numpy() for h in self._host]
        self._copied: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0
        self._offset = 0
        self._slots: list[tuple[int, int, torch.dtype]] = []

    def begin(self) -> None:
        """Start packing a step's inputs (into the host buffer whose last copy has landed)."""
        self._turn ^= 1
        event = self._copied[self._turn]
        if event is not None:
            event.synchronize()
        self._offset = 0
        self._slots = []

    def put(self, values: np.ndarray) -> int:
        """Pack a 1-D array; returns its slot index for `views` after `send`."""
        values = np.ascontiguousarray(values)
        start = _aligned(self._offset)
        end = start + values.nbytes
        if end > self.capacity:
            raise RuntimeError(
                f"step inputs need {end:,} bytes of staging, {self.capacity:,} were sized from the config"
            )
        self._host_np[self._turn][start:end] = values.view(np.uint8)
        self._offset = end
        self._slots.append((start, values.size, torch.from_numpy(values[:0]).dtype))
        return len(self._slots) - 1

    def send(self) -> list[torch.Tensor]:
        """Copy what was packed to the device in one transfer; returns a device view per slot."""
        if self._offset:
            self.device_buffer[: self._offset].copy_(self._host[self._turn][: self._offset], non_blocking=True)
            if self.device.type == "cuda":
                event = self._copied[self._turn] or torch.cuda.Event()
                event.record()
                self._copied[self._turn] = event
        return [self.view(start, size, dtype) for start, size, dtype in self._slots]

    @property
    def packed_slots(self) -> list[tuple[int, int, torch.dtype]]:
        """(offset, length, dtype) of each array packed since `begin`."""
        return self._slots

    @property
    def packed_bytes(self) -> int:
        return self._offset

    def view(self, start: int, size: int, dtype: torch.dtype) -> torch.Tensor:
        return self.device_buffer[start : start + size * dtype.itemsize].view(dtype)

    @staticmethod
    def layout(arrays: list[tuple[int, torch.dtype]]) -> list[tuple[int, int, torch.dtype]]:
        """The slots `put` would give arrays of these (length, dtype): for capturing graphs."""
        slots, offset = [], 0
        for size, dtype in arrays:
            start = _aligned(offset)
            offset = start + size * dtype.itemsize
            slots.append((start, size, dtype))
        return slots
