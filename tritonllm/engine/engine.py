"""LLMEngine: requests in, `RequestOutput`s out, one `step()` at a time.

step(): Scheduler -> ModelRunner (forward + sampling, launched without waiting) -> OutputProcessor
(append tokens, detokenize, check stops; finished requests are freed). A prompt with `n` samples
is `n` engine requests sharing one group.

Overlap scheduling (`scheduler.async_scheduling`, on by default on a GPU): a step schedules and
launches step N+1, then processes step N's results while the GPU runs N+1, so the GPU never waits
for the host's scheduling and output processing. The scheduler schedules a decode on the token
still in flight (a placeholder) and the runner reads that token on the device. A request that
finished in step N (EOS, a stop string) may already be in step N+1: that token is discarded, never
emitted; max_tokens is known ahead, so such requests are not scheduled again. Outputs come one
step later than in the synchronous loop; tokens, logprobs and texts are the same.
"""

from __future__ import annotations

import logging
import os
import random
import time
import weakref

from tritonllm import platform
from tritonllm.config import EngineConfig
from tritonllm.distributed.executor import TensorParallelExecutor
from tritonllm.distributed.parallel_state import SINGLE
from tritonllm.distributed.worker import serve_torchrun_worker
from tritonllm.engine.host_gc import GcPauses, freeze_startup_heap, release_frozen_heap
from tritonllm.engine.kv_cache import KVCacheManager
from tritonllm.engine.output_processor import OutputProcessor
from tritonllm.engine.request import Request, RequestStatus
from tritonllm.engine.scheduler import Scheduler, SchedulerOutput
from tritonllm.loader.hf_config import load_eos_token_ids
from tritonllm.loader.tokenizer import load_tokenizer
from tritonllm.metrics.stats import EngineStats, StepStats, device_memory_metrics
from tritonllm.models.loader import kv_sliding_window
from tritonllm.outputs import RequestOutput
from tritonllm.sampling_params import SamplingParams
from tritonllm.structured_output import StructuredOutputs
from tritonllm.worker.model_runner import PendingStep
from tritonllm.worker.piecewise_graph import piecewise_sizes
from tritonllm.worker.setup import set_up_rank

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        release_frozen_heap()  # engines frozen at their start and dropped since become collectable
        config.cache.validate()
        config.scheduler.validate()
        config.parallel.validate()
        path = config.model.path
        if path is None:
            from tritonllm.models.tiny import tiny_model_path

            path = str(tiny_model_path("LlamaForCausalLM"))
        self.model_path = path
        parallel = config.parallel
        if (
            parallel.tensor_parallel_size > 1
            and parallel.launcher == "torchrun"
            and int(os.environ.get("RANK", "0")) > 0
        ):
            # the same program on every rank: ranks > 0 serve as workers until rank 0 shuts down, then exit
            serve_torchrun_worker(config, path)
        self.dtype = config.model.torch_dtype()
        self.device = platform.DEVICE
        # tensor parallelism: this process is rank 0; the executor starts ranks 1..N-1, which set
        # themselves up from the same config and then follow this runner's steps
        self.executor: TensorParallelExecutor | None = None
        if config.parallel.tensor_parallel_size > 1:
            self.executor = TensorParallelExecutor(config, path)  # stops what it started if it fails
        try:
            rank = set_up_rank(config, path, SINGLE if self.executor is None else self.executor.tp)
            if self.executor is not None:
                self.executor.wait_until_ready()
        except BaseException as error:
            if self.executor is None:
                raise
            worker_error = self.executor.startup_failed(error)  # a worker that failed first is the one to name
            if worker_error is None:
                raise
            raise worker_error from error
        self.model, self.hf_config, self.kernels = rank.model, rank.hf_config, rank.kernels
        self.runner, self.max_model_len = rank.runner, rank.max_model_len
        self.tokenizer = load_tokenizer(config.model.tokenizer or path)
        self.eos_token_ids = frozenset(load_eos_token_ids(path, self.hf_config))
        self.structured_outputs = StructuredOutputs(
            self.tokenizer, self.hf_config.vocab_size, sorted(self.eos_token_ids)
        )
        # every layer windowed: blocks behind the window go back to the pool as requests advance
        self.kv_cache = KVCacheManager(
            rank.num_blocks, config.cache.block_size, config.cache.enable_prefix_caching, kv_sliding_window(self.model)
        )
        step_sizes = piecewise_sizes(config.scheduler.max_num_batched_tokens, config.piecewise_first_size)
        self.scheduler = Scheduler(config.scheduler, self.kv_cache, step_sizes)
        sched = config.scheduler
        self.async_scheduling = platform.is_gpu() if sched.async_scheduling is None else sched.async_scheduling
        self.stats = EngineStats()
        self.output_processor = OutputProcessor(self.tokenizer, self.max_model_len, self.scheduler, self.stats)
        self._in_flight: tuple[SchedulerOutput, PendingStep] | None = None  # overlap: launched, not processed
        self._rng = random.Random(config.model.seed)
        # the workers stop when the engine is shut down, collected, or at interpreter exit
        self._stop_workers = (
            weakref.finalize(self, self.executor.shutdown, self.runner.channel) if self.executor else None
        )
        self._gc_pauses = GcPauses.install()
        if config.gc_freeze:
            frozen = freeze_startup_heap()
            logger.info("froze %d start-up objects out of the cyclic GC (gc_freeze)", frozen)

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker processes (nothing to do with one rank); idempotent."""
        if self._stop_workers is not None:
            self._stop_workers()

    # ---- requests ------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        priority: int | None = None,
    ) -> None:
        if request_id in self.output_processor.groups:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise ValueError("the prompt is empty: give at least one token")
        vocab = self.hf_config.vocab_size
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab:
            raise ValueError(f"prompt_token_ids must lie in [0, {vocab}) for this model")
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise ValueError(f"logit_bias names token {max(params.logit_bias)}: token ids must lie in [0, {vocab})")
        if params.allowed_token_ids and max(params.allowed_token_ids) >= vocab:
            raise ValueError(
                f"allowed_token_ids names token {max(params.allowed_token_ids)}: token ids must lie in [0, {vocab})"
            )
        prompt_len = len(prompt_token_ids)
        if prompt_len >= self.max_model_len:
            raise ValueError(
                f"the prompt ({prompt_len} tokens) is not shorter than max_model_len ({self.max_model_len}):"
                " shorten the prompt or raise max_model_len"
            )
        compiled = self.structured_outputs.compile(params.structured_outputs) if params.structured_outputs else None
        room = self.max_model_len - prompt_len
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        # any integer seed: the device's seed arithmetic is int64 (a base below 2**62 leaves room for n)
        base_seed = params.seed % 2**62 if params.seed is not None else self._rng.getrandbits(62)
        children = []
        for i in range(params.n):
            child = Request(
                request_id=request_id if params.n == 1 else f"{request_id}#{i}",
                prompt_token_ids=list(prompt_token_ids),
                params=params,
                seed=base_seed + i,
                max_tokens=max_tokens,
                eos_token_ids=self.eos_token_ids,
                priority=params.priority if priority is None else priority,
            )
            if params.prompt_logprobs is not None:
                child.prompt_logprobs = [None]
            if compiled is not None:
                child.grammar = self.structured_outputs.state(compiled)
            children.append(child)
        self.output_processor.add_group(request_id, prompt, children)
        for child in children:
            self.scheduler.add_request(child)

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and free its blocks (a token of it still in flight is discarded)."""
        group = self.output_processor.pop_group(request_id)
        if group is None:
            return
        for child in group.children:
            if not child.is_finished:
                self.scheduler.finish(child, RequestStatus.FINISHED_ABORTED)

    def get_metrics(self):
        kv = self.kv_cache
        return (
            self.stats.snapshot(
                len(self.scheduler.running),
                len(self.scheduler.waiting),
                kv.usage,
                self.scheduler.num_preemptions,
                kv.prefix_cache_queries,
                kv.prefix_cache_hits,
            )
            + device_memory_metrics(self.device)
            + self._gc_pauses.metrics()
        )

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or self._in_flight is not None

    # ---- the step ------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one step; returns the outputs of the groups whose results it processed (a finished
        group is last seen here): every step's for CUMULATIVE requests, the final one for FINAL_ONLY.
        With overlap scheduling the results processed are the previous step's. If a step fails, the
        requests in it (every request holding state in the batch: their state is unknown) are aborted
        and their blocks freed, the error is raised, and the engine keeps serving: requests still
        waiting to start are kept and run in later steps."""
        try:
            if self.executor is not None:
                self.executor.check_workers()
            sched = self.scheduler.schedule()
            self._record_step(sched)
            launched = None if sched.is_empty else (sched, self._execute(sched))
            if self.async_scheduling:
                previous, self._in_flight = self._in_flight, launched
            else:
                previous = launched
            return [] if previous is None else self._process(*previous)
        except BaseException:
            self._abort_failed_step()
            raise

    def _execute(self, sched: SchedulerOutput) -> PendingStep:
        if self.executor is None:
            return self.runner.execute(sched)
        try:
            return self.runner.execute(sched)
        except BaseException as error:  # the ranks may be midway through the step: the engine stops
            raise self.executor.step_failed(error) from error

    def _record_step(self, sched: SchedulerOutput) -> None:
        self.stats.steps.append(
            StepStats(
                time_s=time.monotonic(),
                num_scheduled_seqs=len(sched.scheduled),
                num_scheduled_tokens=sched.num_batched_tokens,
                num_running=len(self.scheduler.running),
                num_waiting=len(self.scheduler.waiting),
                kv_cache_usage=self.kv_cache.usage,
                num_preempted=len(sched.preempted),
            )
        )

    def _process(self, sched: SchedulerOutput, pending: PendingStep) -> list[RequestOutput]:
        """Apply a finished step's results: its KV is written (its blocks can be shared), its tokens
        go to the output processor."""
        result = pending.result()
        self.kv_cache.confirm_step(sched.step_id)
        for s in sched.scheduled:
            r = s.request
            r.num_output_placeholders -= s.samples
            if r.is_finished:
                continue
            end = s.start + s.num_new_tokens
            if s.start < r.num_prompt_tokens:
                self.stats.prompt_tokens += min(end, r.num_prompt_tokens) - s.start
            self.kv_cache.cache_computed_blocks(r, end)
        return self.output_processor.process(result, time.monotonic())

    def _abort_failed_step(self) -> None:
        """After a failed step: forget publications whose KV may be unwritten (none of the failed
        requests' blocks stays in the prefix cache), drop the step in flight, abort every request that
        holds state in the batch (running: scheduled in the failed step, or in the batch beside it),
        freeing its blocks, and reset the batch. Requests waiting to start hold no state: they stay."""
        self._in_flight = None
        self.kv_cache.discard_unconfirmed()
        failed = {self.output_processor.group_id(r) for r in self.scheduler.running}
        for request_id in failed:
            self.abort_request(request_id)
        self.runner.reset_batch()
