"""Paged KV-cache bookkeeping: which physical blocks each request holds.

Mechanism only; the scheduler decides who gets blocks. The cache tensors themselves live in the
model runner: per layer K and V of shape [num_blocks, block_size, num_kv_heads, head_dim].
Invariant after every step: num_free_blocks + num_used_blocks == num_blocks.
"""

from __future__ import annotations

from collections import deque


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._blocks: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return sum(len(b) for b in self._blocks.values())

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def block_ids(self, request_id: str) -> list[int]:
        return self._blocks.get(request_id, [])

    def num_blocks_needed(self, request_id: str, num_total_tokens: int) -> int:
        """Blocks to add so that the request's first `num_total_tokens` tokens have slots."""
        return max(0, cdiv(num_total_tokens, self.block_size) - len(self.block_ids(request_id)))

    def allocate_slots(self, request_id: str, num_total_tokens: int) -> bool:
        """Grow the request's block table to cover `num_total_tokens`; False (nothing taken) if short."""
        needed = self.num_blocks_needed(request_id, num_total_tokens)
        if needed > len(self._free):
            return False
        blocks = self._blocks.setdefault(request_id, [])
        blocks.extend(self._free.popleft() for _ in range(needed))
        return True

    def free(self, request_id: str) -> None:
        for block in reversed(self._blocks.pop(request_id, [])):
            self._free.append(block)

    def check_invariant(self) -> None:
        used = [b for blocks in self._blocks.values() for b in blocks]
        if len(used) + len(self._free) != self.num_blocks or len(set(used) | set(self._free)) != self.num_blocks:
            raise AssertionError(
                f"KV blocks leaked or doubly owned: {len(self._free)} free + {len(used)} used != {self.num_blocks}"
            )
