"""Paged KV-cache bookkeeping: which physical blocks each request holds, and prefix caching.

Mechanism only; the scheduler decides who gets blocks. The cache tensors live in the model
runner: per layer K and V of shape [num_blocks, block_size, num_kv_heads, head_dim].

Prefix caching (as vLLM v1): every full block of a request gets a hash chaining its parent
block's hash, its token ids and extra keys; a table maps hashes to blocks. Blocks are
ref-counted; a block whose count drops to zero joins the free queue but keeps its hash, so it can
be reused until it is needed for new data. The free queue is the LRU: blocks leave it from the
front (least recently freed first), and a request's blocks are freed tail first, so a prefix's
later blocks are evicted before its earlier ones.

Blocks enter the prefix cache only once their KV is written. A request admitted in a step
publishes the blocks that step will compute at once, so that later admissions of the same step
(and, with overlap scheduling, of the next one, which runs after it on the same stream) can share
them; those publications stay unconfirmed until the engine has the step's results
(`confirm_step`). If the step fails instead, `discard_unconfirmed` forgets them, so no later
request is served KV that was never computed.

Sliding windows (`sliding_window` W, for models whose every attention layer has one, the largest):
a query at position p reads no key at or before p - W, and the kernels skip such keys' blocks, so
`release_out_of_window` gives a request's leading blocks wholly before (first position of its step
- W) back to the pool: their table entries stay (stale, never read). Blocks published to the
prefix cache are released only once published, so they stay cached (evictable), as vLLM does.

Invariant after every step: free + in use + cached-evictable == num_blocks.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from tritonllm.engine.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


BlockHash = bytes


def hash_block(parent: BlockHash | None, token_ids: Sequence[int], extra_keys: tuple = ()) -> BlockHash:
    """A full block's hash: its parent's hash, its token ids and extra keys (LoRA, multimodal, ...)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"root")
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    if extra_keys:
        h.update(repr(extra_keys).encode())
    return h.digest()


class KVCacheManager:
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, sliding_window: int | None = None
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.sliding_window = sliding_window
        self._num_released: dict[str, int] = {}  # each request's leading blocks released (out of window)
        self._ref_count = [0] * num_blocks
        self._block_hash: list[BlockHash | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # LRU: evict from the front
        self._cached: dict[BlockHash, int] = {}
        self._blocks: dict[str, list[int]] = {}
        self._hashes: dict[str, list[BlockHash]] = {}  # each request's full-block hashes so far
        self._num_published: dict[str, int] = {}  # each request's leading blocks already in the table
        self._unconfirmed: dict[int, int] = {}  # block -> id of the step that writes its published KV
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found

    # ---- accounting ----------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks a request can take now: empty ones plus cached ones that can be evicted."""
        return len(self._free)

    @property
    def num_cached_free_blocks(self) -> int:
        return sum(1 for b in self._free if self._block_hash[b] is not None)

    @property
    def num_used_blocks(self) -> int:
        return sum(1 for c in self._ref_count if c > 0)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def block_ids(self, request_id: str) -> list[int]:
        return self._blocks.get(request_id, [])

    # ---- prefix cache --------------------------------------------------------------------

    def _update_hashes(self, request: Request) -> list[BlockHash]:
        hashes = self._hashes.setdefault(request.request_id, [])
        num_full = request.num_tokens // self.block_size
        if len(hashes) < num_full:
            tokens = request.all_token_ids
            for i in range(len(hashes), num_full):
                block_tokens = tokens[i * self.block_size : (i + 1) * self.block_size]
                hashes.append(hash_block(hashes[-1] if hashes else None, block_tokens, request.extra_keys))
        return hashes

    def find_cached_prefix(self, request: Request) -> list[int]:
        """The cached blocks of the request's longest cached prefix of full blocks. At least the last
        token is always left to compute (its logits are needed), so a fully cached prompt hits one
        block less."""
        if not self.enable_prefix_caching or request.params.prompt_logprobs is not None:
            return []
        hashes = self._update_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hit = []
        for h in hashes[:max_blocks]:
            block = self._cached.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def record_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted request's prefix-cache lookup (tokens), for the hit-rate metrics."""
        if self.enable_prefix_caching:
            self.prefix_cache_queries += num_query_tokens
            self.prefix_cache_hits += num_hit_tokens

    def cache_computed_blocks(self, request: Request, num_computed_tokens: int, step_id: int | None = None) -> None:
        """Publish the request's full blocks within its first `num_computed_tokens` tokens, so later
        requests can reuse them: KV already written (step_id None), or that step `step_id` writes
        (unconfirmed until `confirm_step`)."""
        if not self.enable_prefix_caching:
            return
        blocks = self._blocks.get(request.request_id)
        first = self._num_published.get(request.request_id, 0)  # blocks before it are published already
        if not blocks or num_computed_tokens // self.block_size <= first:
            return  # no new full block (most decode steps): nothing to hash
        hashes = self._update_hashes(request)
        num_computed_full = min(num_computed_tokens // self.block_size, len(blocks), len(hashes))
        self._num_published[request.request_id] = num_computed_full
        for i in range(first, num_computed_full):
            block, h = blocks[i], hashes[i]
            if self._block_hash[block] is None and h not in self._cached:
                self._block_hash[block] = h
                self._cached[h] = block
                if step_id is not None:
                    self._unconfirmed[block] = step_id

    def confirm_step(self, step_id: int) -> None:
        """Step `step_id` (and every step before it) has written its KV: its publications stand."""
        if self._unconfirmed:
            self._unconfirmed = {b: s for b, s in self._unconfirmed.items() if s > step_id}

    def discard_unconfirmed(self) -> None:
        """A step failed: forget every publication whose KV may never have been written."""
        for block in list(self._unconfirmed):
            self._evict(block)
        self._unconfirmed.clear()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block not in use; False if some cached blocks are in use (they stay)."""
        for block in list(self._free):
            self._evict(block)
        return not self._cached

    def _evict(self, block: int) -> None:
        h = self._block_hash[block]
        if h is not None:
            self._block_hash[block] = None
            self._unconfirmed.pop(block, None)
            if self._cached.get(h) == block:
                del self._cached[h]

    # ---- allocation ----------------------------------------------------------------------

    def allocate_slots(
        self, request_id: str, num_total_tokens: int, cached_blocks: Sequence[int] = ()
    ) -> list[int] | None:
        """Grow the request's block table to cover `num_total_tokens`, first with `cached_blocks` (a
        prefix-cache hit, for a request holding no blocks yet), then with new blocks. Returns the
        blocks appended to its table (the scheduler's delta for the runner's block table); None,
        and nothing taken, if there are not enough free blocks."""
        blocks = self._blocks.get(request_id)
        have = (len(blocks) if blocks else 0) + len(cached_blocks)
        needed = cdiv(num_total_tokens, self.block_size) - have
        if needed <= 0 and not cached_blocks:
            return []
        needed = max(0, needed)
        revived = sum(1 for b in cached_blocks if self._ref_count[b] == 0)  # taken out of the free queue
        if needed + revived > len(self._free):
            return None
        if blocks is None:
            blocks = self._blocks[request_id] = []
        added = list(cached_blocks)
        for b in cached_blocks:
            if self._ref_count[b] == 0:
                del self._free[b]
            self._ref_count[b] += 1
        for _ in range(needed):
            b, _ = self._free.popitem(last=False)
            self._evict(b)
            self._ref_count[b] = 1
            added.append(b)
        blocks.extend(added)
        return added

    def release_out_of_window(self, request_id: str, first_position: int) -> None:
        """With a sliding window W: release the request's leading blocks wholly before position
        first_position - W (no query at first_position or later reads them), tail first, keeping
        their hashes. With prefix caching, only blocks already published (their KV is written and
        they may stay cached). Their entries stay in the block table, stale."""
        if self.sliding_window is None:
            return
        blocks = self._blocks.get(request_id)
        if not blocks:
            return
        num_out = min((first_position - self.sliding_window) // self.block_size, len(blocks))
        if self.enable_prefix_caching:
            num_out = min(num_out, self._num_published.get(request_id, 0))
        released = self._num_released.get(request_id, 0)
        if num_out <= released:
            return
        self._release(blocks[released:num_out])
        self._num_released[request_id] = num_out

    def _release(self, blocks: list[int]) -> None:
        """Drop one reference to each block, tail first (evicted first), keeping their hashes for reuse."""
        for b in reversed(blocks):
            self._ref_count[b] -= 1
            if self._ref_count[b] == 0:
                self._free[b] = None

    def free(self, request_id: str) -> None:
        """Release the request's blocks (those not released already), keeping their hashes for reuse."""
        self._release(self._blocks.pop(request_id, [])[self._num_released.pop(request_id, 0) :])
        self._hashes.pop(request_id, None)
        self._num_published.pop(request_id, None)

    def check_invariant(self) -> None:
        in_use = self.num_used_blocks
        cached = self.num_cached_free_blocks
        empty = self.num_free_blocks - cached
        held = [b for r, blocks in self._blocks.items() for b in blocks[self._num_released.get(r, 0) :]]
        if empty + cached + in_use != self.num_blocks or set(held) != {b for b, c in enumerate(self._ref_count) if c}:
            raise AssertionError(
                f"KV blocks leaked: {empty} free + {cached} cached + {in_use} in use != {self.num_blocks}"
            )
        for b in self._free:
            if self._ref_count[b] != 0:
                raise AssertionError(f"block {b} is both free and in use")
        for h, b in self._cached.items():
            if self._block_hash[b] != h:
                raise AssertionError(f"hash table points block {b} at a hash it no longer holds")
