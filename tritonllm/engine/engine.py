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

import gc
import logging
import random
import time

import torch

from tritonllm import platform
from tritonllm.config import EngineConfig, SchedulerConfig
from tritonllm.engine.kv_cache import KVCacheManager, cdiv
from tritonllm.engine.output_processor import OutputProcessor
from tritonllm.engine.request import Request, RequestStatus
from tritonllm.engine.scheduler import Scheduler, SchedulerOutput
from tritonllm.kernels.registry import OPS, KernelContext, select_kernels
from tritonllm.loader.hf_config import load_eos_token_ids
from tritonllm.loader.tokenizer import load_tokenizer
from tritonllm.metrics.stats import EngineStats, StepStats
from tritonllm.models.loader import (
    fit_rope_tables,
    kv_sliding_window,
    layer_features,
    linear_formats,
    load_model,
    model_max_len,
    used_ops,
)
from tritonllm.outputs import RequestOutput
from tritonllm.sampling_params import SamplingParams
from tritonllm.worker.model_runner import ModelRunner, PendingStep

# the ops a piecewise graph's pieces hold (attention and the KV write run eagerly between them)
PIECEWISE_OPS = ("rms_norm", "rotary", "activation", "linear", "moe")
logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        config.cache.validate()
        config.scheduler.validate()
        path = config.model.path
        if path is None:
            from tritonllm.models.tiny import tiny_model_path

            path = str(tiny_model_path("LlamaForCausalLM"))
        self.model_path = path
        self.dtype = config.model.torch_dtype()
        self.device = platform.DEVICE
        self.model, self.hf_config = load_model(
            path, self.dtype, self.device, config.model.quantization, config.model.load_format
        )
        kv_dtype = config.cache.torch_kv_dtype(self.dtype)
        # this engine's kernels, bound to its model's layers by the runner: another engine in the same
        # process may choose others
        context = KernelContext(
            platform.PLATFORM, self.dtype, kv_dtype, getattr(self.model, "head_dim", None), linear_formats(self.model),
            layer_features(self.model),
        )  # fmt: skip
        self.kernels = select_kernels(config.kernels.choices(), context, default=config.kernels.default())
        logger.info("kernels: %s", self.kernels.choice)
        self.tokenizer = load_tokenizer(config.model.tokenizer or path)
        self.eos_token_ids = frozenset(load_eos_token_ids(path, self.hf_config))

        longest = model_max_len(self.hf_config)
        self.max_model_len = config.model.max_model_len or longest
        if self.max_model_len > longest:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's maximum length ({longest}: "
                "max_position_embeddings, extended by its RoPE scaling if any): lower max_model_len"
            )
        fit_rope_tables(self.model, self.max_model_len)
        sched = config.scheduler
        if not sched.enable_chunked_prefill and sched.max_num_batched_tokens < self.max_model_len:
            # whole-prompt prefills must fit one step
            logger.info(
                "chunked prefill off: max_num_batched_tokens raised from %d to max_model_len %d",
                sched.max_num_batched_tokens, self.max_model_len,
            )  # fmt: skip
            sched.max_num_batched_tokens = self.max_model_len

        block_size = config.cache.block_size
        self.runner = ModelRunner(
            self.model, self.dtype, self.device, block_size, kv_dtype,
            max_num_seqs=sched.max_num_seqs, max_model_len=self.max_model_len,
            max_num_batched_tokens=sched.max_num_batched_tokens, kernels=self.kernels,
        )  # fmt: skip
        num_blocks = self._num_kv_blocks()
        capacity = num_blocks * block_size
        if self.max_model_len > capacity:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the KV cache ({capacity:,} tokens): lower max_model_len"
                " or raise gpu_memory_utilization / num_gpu_blocks_override"
            )
        self.runner.allocate_kv_cache(num_blocks)
        if not config.enforce_eager and platform.is_gpu():
            self._enable_graphs(config, sched)
        if platform.is_gpu():
            self.runner.warm_up()  # Triton compiles prefill kernels now, not in the first generate
        if config.cache.calculate_kv_scales:
            self.runner.calibrate_kv_scales()
        logger.info(
            "KV cache (%s): %d blocks x %d = %s tokens; max concurrency at max_model_len %d: %.1fx",
            self.runner.kv_dtype,
            num_blocks,
            block_size,
            f"{capacity:,}",
            self.max_model_len,
            capacity / self.max_model_len,
        )
        # every layer windowed: blocks behind the window go back to the pool as requests advance
        self.kv_cache = KVCacheManager(
            num_blocks, block_size, config.cache.enable_prefix_caching, kv_sliding_window(self.model)
        )
        self.scheduler = Scheduler(sched, self.kv_cache)
        self.async_scheduling = platform.is_gpu() if sched.async_scheduling is None else sched.async_scheduling
        self.stats = EngineStats()
        self.output_processor = OutputProcessor(self.tokenizer, self.max_model_len, self.scheduler, self.stats)
        self._in_flight: tuple[SchedulerOutput, PendingStep] | None = None  # overlap: launched, not processed
        self._rng = random.Random(config.model.seed)

    def _enable_graphs(self, config: EngineConfig, sched: SchedulerConfig) -> None:
        """Decode graphs hold the whole step; piecewise graphs everything of a forward but attention
        and the KV write. A chosen implementation that cannot be captured turns off the graphs that
        would hold it (logged), so e.g. kernels.attention=torch_ref runs decode steps eagerly."""
        used = used_ops(self.model)
        no_decode = self.kernels.uncapturable(op for op in OPS if op in used)
        no_piecewise = self.kernels.uncapturable(op for op in PIECEWISE_OPS if op in used)
        if no_decode:
            logger.info("decode graphs off: kernels %s cannot be captured (they sync with the host)", no_decode)
        else:
            self.runner.enable_decode_graphs(sched.max_num_seqs, self.max_model_len)
        if not config.piecewise_graphs:
            return
        if no_piecewise:
            logger.info("piecewise graphs off: kernels %s cannot be captured (they sync with the host)", no_piecewise)
            return
        # Their pool holds about one max_num_batched_tokens forward's activations for good. The
        # KV cache was sized to leave the profiled peak of such a step (weights, activations,
        # logits, sampling) free, so capture fits; the logits and sampling of later steps then
        # come on top of the pool, out of the 1 - gpu_memory_utilization share.
        self.runner.enable_piecewise_graphs(sched.max_num_batched_tokens)

    def _profile_peak_bytes(self) -> int:
        """The profiling step's peak; one that does not fit the GPU is refused with what it needed and
        the fix, instead of a raw CUDA out-of-memory error."""
        sched = self.config.scheduler
        free_before, total = torch.cuda.mem_get_info(self.device)
        try:
            return self.runner.profile_peak_bytes(sched.max_num_batched_tokens, sched.max_num_seqs)
        except torch.OutOfMemoryError as e:
            gc.collect()
            torch.cuda.empty_cache()
            raise ValueError(
                f"the profiling step (one forward of max_num_batched_tokens={sched.max_num_batched_tokens} tokens in up "
                f"to max_num_seqs={sched.max_num_seqs} sequences, with its logits) does not fit in GPU memory: "
                f"{free_before / 2**30:.1f} of {total / 2**30:.1f} GiB were free after loading the weights "
                f"({str(e).splitlines()[0]}). Lower max_num_batched_tokens (enable chunked prefill so it need not "
                "cover max_model_len), lower max_num_seqs or max_model_len, or use a GPU with more memory"
            ) from e

    def _num_kv_blocks(self) -> int:
        cache = self.config.cache
        if cache.num_gpu_blocks_override is not None:
            return cache.num_gpu_blocks_override
        if not platform.is_gpu():
            return cdiv(cache.cpu_kv_cache_tokens, cache.block_size)
        # As vLLM: the utilization share of the card, less the peak of a profiling step at the
        # largest batch (weights + activations), and less what other processes and the CUDA context hold.
        gc.collect()  # engines dropped before this one (reference cycles) give their memory back first
        torch.cuda.empty_cache()
        peak = self._profile_peak_bytes()
        free, total = torch.cuda.mem_get_info(self.device)
        others = max(0, (total - free) - torch.cuda.memory_reserved(self.device))
        available = total * cache.gpu_memory_utilization - peak - others
        num_blocks = int(available // self.runner.kv_bytes_per_block())
        if num_blocks <= 0:
            raise ValueError(
                f"no GPU memory left for the KV cache: the profiling step peaked at {peak / 2**30:.1f} GiB of"
                f" {total / 2**30:.1f} GiB x gpu_memory_utilization {cache.gpu_memory_utilization}:"
                " raise gpu_memory_utilization or lower max_num_batched_tokens / max_num_seqs"
            )
        return num_blocks

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
        prompt_len = len(prompt_token_ids)
        if prompt_len >= self.max_model_len:
            raise ValueError(
                f"the prompt ({prompt_len} tokens) is not shorter than max_model_len ({self.max_model_len}):"
                " shorten the prompt or raise max_model_len"
            )
        room = self.max_model_len - prompt_len
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        base_seed = params.seed if params.seed is not None else self._rng.getrandbits(62)
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
        return self.stats.snapshot(
            len(self.scheduler.running),
            len(self.scheduler.waiting),
            kv.usage,
            self.scheduler.num_preemptions,
            kv.prefix_cache_queries,
            kv.prefix_cache_hits,
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
            sched = self.scheduler.schedule()
            self._record_step(sched)
            launched = None if sched.is_empty else (sched, self.runner.execute(sched))
            if self.async_scheduling:
                previous, self._in_flight = self._in_flight, launched
            else:
                previous = launched
            return [] if previous is None else self._process(*previous)
        except BaseException:
            self._abort_failed_step()
            raise

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
