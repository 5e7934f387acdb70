"""Decides which tokens run in each step: continuous batching with chunked prefill.

Every step has a token budget (`max_num_batched_tokens`) and a sequence cap (`max_num_seqs`).
Running requests go first (decodes need one token; a partly prefilled prompt takes what the
budget leaves), then waiting requests are admitted in policy order. A prompt longer than the
budget left is chunked (or waits, with chunked prefill off). When blocks run out, the most
recently admitted running request is preempted: its blocks are freed and it is recomputed later,
ahead of new arrivals. Policies: `fcfs` (arrival order) and `priority` (lower `priority` first,
then arrival; the victim of a preemption is the lowest-priority running request). The decision is
a plain `SchedulerOutput` for the model runner.
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
    num_new_tokens: int  # computed this step, from request.num_computed_tokens on

    @property
    def samples(self) -> bool:
        """Whether this step reaches the request's last known token, so a new token is sampled."""
        return self.request.num_computed_tokens + self.num_new_tokens == self.request.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager) -> None:
        self.config = config
        self.kv_cache = kv_cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self._arrivals = itertools.count()

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
        out = SchedulerOutput()
        chunked = self.config.enable_chunked_prefill
        budget = lambda: self.config.max_num_batched_tokens - out.num_batched_tokens

        # 1. Running requests, oldest first: each needs its remaining tokens (1 for a decode).
        index = 0
        while index < len(self.running) and budget() > 0:
            request = self.running[index]
            num_new = request.num_tokens - request.num_computed_tokens
            if not chunked and num_new > budget():
                index += 1
                continue
            num_new = min(num_new, budget())
            if not self._allocate_or_preempt(request, num_new, out):
                break  # the request itself was preempted: what follows it has no blocks either
            out.scheduled.append(ScheduledRequest(request, num_new))
            index = self.running.index(request) + 1  # a victim before it may have left the list

        # 2. Waiting requests, in policy order, while budget, sequence slots and blocks last. A
        # fresh (or preempted) request starts after its longest cached prefix.
        if not out.preempted:
            while self.waiting and budget() > 0 and len(self.running) < self.config.max_num_seqs:
                request = self.waiting[0]
                cached = self.kv_cache.find_cached_prefix(request) if request.num_computed_tokens == 0 else []
                num_cached_tokens = len(cached) * self.kv_cache.block_size
                num_new = request.num_tokens - request.num_computed_tokens - num_cached_tokens
                if not chunked and num_new > budget():
                    break
                num_new = min(num_new, budget())
                num_total = request.num_computed_tokens + num_cached_tokens + num_new
                if not self.kv_cache.allocate_slots(request.request_id, num_total, cached):
                    break
                if request.num_computed_tokens == 0:
                    self.kv_cache.record_lookup(request.num_tokens, num_cached_tokens)
                request.num_computed_tokens += num_cached_tokens
                # Published now, so later admissions of this step share them: each layer writes the
                # step's KV before any attention reads it, and no preemption follows admissions.
                self.kv_cache.cache_computed_blocks(request, request.num_computed_tokens + num_new)
                self.waiting.popleft()
                request.status = RequestStatus.RUNNING
                if request.times.first_scheduled is None:
                    request.times.first_scheduled = time.monotonic()
                self.running.append(request)
                out.scheduled.append(ScheduledRequest(request, num_new))
        return out

    def _allocate_or_preempt(self, request: Request, num_new: int, out: SchedulerOutput) -> bool:
        """Give `request` slots for `num_new` tokens, preempting running requests (per policy) as
        needed. A victim already scheduled in this step leaves the step. Returns False if `request`
        itself had to be preempted."""
        while not self.kv_cache.allocate_slots(request.request_id, request.num_computed_tokens + num_new):
            victim = self._pick_victim()
            self.running.remove(victim)
            out.scheduled = [s for s in out.scheduled if s.request is not victim]
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is request:
                return False
        return True

    def _pick_victim(self) -> Request:
        if self.config.policy == "priority":
            return max(self.running, key=self._key)
        return self.running[-1]  # the most recently admitted

    def _preempt(self, request: Request) -> None:
        self.kv_cache.free(request.request_id)
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
        request.status = status
        request.times.finished = time.monotonic()
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv_cache.free(request.request_id)
