"""Decides which tokens run in each step: continuous batching with chunked prefill.

Every step has a token budget (`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`).
Running requests go first (decodes need one token; a partly prefilled prompt takes what the
budget leaves), then waiting requests are admitted in policy order. A prompt longer than the
budget left is chunked (or waits, with chunked prefill off). When blocks run out, the most
recently admitted running request is preempted: its blocks are freed and it is recomputed later,
ahead of new arrivals. Policies: `fcfs` (arrival order) and `priority` (lower `priority` first,
then arrival; the victim of a preemption is the lowest-priority running request). A step's last
new prompt may yield its last few tokens to the next step so that the step ends on one of the
padded token counts the forward runs at (`align_prefill_chunks`, see `_aligned`).

The scheduler does its own bookkeeping when it schedules: a request's `num_computed_tokens`
advances by the step's tokens, and a step that samples adds an output placeholder, resolved
when the engine processes that step's results. So with overlap scheduling (the next step
scheduled while this one runs) a decode is scheduled on the token still in flight, and a
request whose in-flight token is its last one (max_tokens) is not scheduled again.

The decision is a plain `SchedulerOutput` of deltas for the model runner's persistent batch:
what each request computes, the blocks it gained, and who left (finished, aborted, preempted).
Bookkeeping is O(1) per request: running requests live in an insertion-ordered dict.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections import deque
from dataclasses import dataclass, field

from tritonllm.config import SchedulerConfig
from tritonllm.engine.kv_cache import KVCacheManager
from tritonllm.engine.request import Request, RequestStatus


@dataclass
class ScheduledRequest:
    request: Request
    start: int  # first position computed this step (the request's num_computed_tokens before it)
    num_new_tokens: int
    new_block_ids: list[int]  # blocks appended to its block table (all of them when it is admitted)
    samples: bool  # the step reaches its last token (known or in flight), so a token is sampled


@dataclass
class SchedulerOutput:
    step_id: int = 0
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    # requests that left the running batch (finished, aborted, preempted) since the last step that
    # ran: the runner frees their rows before it adds this step's new ones
    removed_ids: list[str] = field(default_factory=list)
    num_batched_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager, step_sizes: list[int] | None = None) -> None:
        self.config = config
        self.kv_cache = kv_cache
        # the padded token counts the forward runs at (ascending): steps with a prefill align to them
        self.step_sizes = (
            sorted(step_sizes or []) if config.enable_chunked_prefill and config.align_prefill_chunks else []
        )
        self.waiting: deque[Request] = deque()
        self.running: dict[Request, None] = {}  # in admission order
        self.num_preemptions = 0
        self._arrivals = itertools.count()
        self._steps = itertools.count()
        self._removed_ids: list[str] = []  # handed to the next step that runs

    def _key(self, request: Request) -> tuple[int, int]:
        return (request.priority, request.arrival_index)

    def add_request(self, request: Request) -> None:
        request.arrival_index = next(self._arrivals)
        if self.config.policy == "priority":
            self._insert_by_priority(request)
        else:
            self.waiting.append(request)

    def _insert_by_priority(self, request: Request) -> None:
        keys = [self._key(r) for r in self.waiting]
        self.waiting.insert(bisect.bisect_right(keys, self._key(request)), request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(step_id=next(self._steps))
        chunked = self.config.enable_chunked_prefill
        max_tokens = self.config.max_num_batched_tokens

        # 1. Running requests, oldest first: each needs its remaining tokens (1 for a decode).
        for request in list(self.running):
            budget = max_tokens - out.num_batched_tokens
            if budget <= 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = request.num_tokens_with_placeholders - request.num_computed_tokens
            if len(request.output_token_ids) + request.num_output_placeholders >= request.max_tokens:
                continue  # its token in flight is its last
            if not chunked and num_new > budget:
                continue
            num_new = min(num_new, budget)
            # sliding windows: blocks this step's queries cannot see go back first
            self.kv_cache.release_out_of_window(request.request_id, request.num_computed_tokens)
            new_blocks = self._allocate_or_preempt(request, num_new, out)
            if new_blocks is None:
                break  # the request itself was preempted: what follows it has no blocks either
            self._add(out, request, num_new, new_blocks)

        # 2. Waiting requests, in policy order, while budget, sequence slots and blocks last. A
        # fresh (or preempted) request starts after its longest cached prefix.
        if not out.preempted:
            while self.waiting and out.num_batched_tokens < max_tokens and len(self.running) < self.config.max_num_seqs:
                request = self.waiting[0]
                if request.num_output_placeholders:
                    break  # preempted with a token in flight: it resumes once that token is known
                budget = max_tokens - out.num_batched_tokens
                cached = self.kv_cache.find_cached_prefix(request)
                num_cached_tokens = len(cached) * self.kv_cache.block_size
                num_new = request.num_tokens - num_cached_tokens
                if not chunked and num_new > budget:
                    break
                num_new = min(num_new, budget)
                if len(self.waiting) == 1:  # the step's last prefill: nothing after it fills the padding
                    num_new = self._aligned(out.num_batched_tokens, num_new)
                new_blocks = self.kv_cache.allocate_slots(request.request_id, num_cached_tokens + num_new, cached)
                if new_blocks is None:
                    break
                self.kv_cache.record_lookup(request.num_tokens, num_cached_tokens)
                request.num_computed_tokens = num_cached_tokens
                # Published now, so later admissions of this step (and the next, which runs after it
                # on the stream) share them: each layer writes the step's KV before any attention
                # reads it. Unconfirmed until the step's results arrive (kv_cache.confirm_step).
                self.kv_cache.cache_computed_blocks(request, num_cached_tokens + num_new, out.step_id)
                self.kv_cache.release_out_of_window(request.request_id, num_cached_tokens)
                self.waiting.popleft()
                request.status = RequestStatus.RUNNING
                if request.times.first_scheduled is None:
                    request.times.first_scheduled = time.monotonic()
                self.running[request] = None
                self._add(out, request, num_new, new_blocks)
        if out.scheduled:  # an empty step does not run: its removals wait for the next one
            out.removed_ids, self._removed_ids = self._removed_ids, []
        return out

    def _aligned(self, num_batched: int, num_new: int) -> int:
        """num_new prefill tokens after num_batched others, shortened so that the step ends on a padded
        size S (step_sizes) when it would overshoot S by less than it falls short of the next size: a
        step of S + 13 tokens runs at, and costs about as much as, the next size (the padding computes
        nothing), while the 13 tokens join the next step almost for free."""
        end = num_batched + num_new
        i = bisect.bisect_right(self.step_sizes, end) - 1
        if i < 0 or i + 1 >= len(self.step_sizes) or self.step_sizes[i] == end:
            return num_new
        over, short = end - self.step_sizes[i], self.step_sizes[i + 1] - end
        return num_new - over if over < num_new and over < short else num_new

    @staticmethod
    def _add(out: SchedulerOutput, request: Request, num_new: int, new_blocks: list[int]) -> None:
        start = request.num_computed_tokens
        samples = start + num_new == request.num_tokens_with_placeholders
        out.scheduled.append(ScheduledRequest(request, start, num_new, new_blocks, samples))
        out.num_batched_tokens += num_new
        request.num_computed_tokens = start + num_new
        if samples:
            request.num_output_placeholders += 1

    def _allocate_or_preempt(self, request: Request, num_new: int, out: SchedulerOutput) -> list[int] | None:
        """Give `request` slots for `num_new` tokens, preempting running requests (per policy) as
        needed; returns its new blocks. A victim already scheduled in this step leaves the step.
        Returns None if `request` itself had to be preempted."""
        while True:
            new_blocks = self.kv_cache.allocate_slots(request.request_id, request.num_computed_tokens + num_new)
            if new_blocks is not None:
                return new_blocks
            victim = self._pick_victim()
            for i, s in enumerate(out.scheduled):
                if s.request is victim:  # undo what scheduling it in this step added
                    del out.scheduled[i]
                    out.num_batched_tokens -= s.num_new_tokens
                    victim.num_output_placeholders -= s.samples
                    break
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is request:
                return None

    def _pick_victim(self) -> Request:
        if self.config.policy == "priority":
            return max(self.running, key=self._key)
        return next(reversed(self.running))  # the most recently admitted

    def _preempt(self, request: Request) -> None:
        del self.running[request]
        self.kv_cache.free(request.request_id)
        self._removed_ids.append(request.request_id)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        if self.config.policy == "priority":
            self._insert_by_priority(request)
        else:
            self.waiting.appendleft(request)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Take a request out of the queues (finished or aborted) and free its blocks at once."""
        if request.status is RequestStatus.RUNNING:
            del self.running[request]
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        request.status = status
        request.times.finished = time.monotonic()
        self.kv_cache.free(request.request_id)
        self._removed_ids.append(request.request_id)
