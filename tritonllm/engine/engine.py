"""LLMEngine: requests in, `RequestOutput`s out, one `step()` at a time.

step(): Scheduler -> ModelRunner (forward + sampling) -> append tokens, detokenize, check stops,
free finished requests. A prompt with `n` samples is `n` engine requests sharing one group.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

import torch

from tritonllm import platform
from tritonllm.config import EngineConfig
from tritonllm.engine.detokenizer import IncrementalDetokenizer, find_stop_string
from tritonllm.engine.kv_cache import KVCacheManager, cdiv
from tritonllm.engine.request import Request, RequestStatus
from tritonllm.engine.scheduler import Scheduler
from tritonllm.kernels import ops
from tritonllm.loader.hf_config import load_eos_token_ids
from tritonllm.loader.tokenizer import load_tokenizer
from tritonllm.metrics.stats import EngineStats, StepStats
from tritonllm.models.loader import load_model
from tritonllm.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from tritonllm.sampling_params import SamplingParams
from tritonllm.worker.model_runner import ModelRunner, StepResult

logger = logging.getLogger(__name__)


@dataclass
class RequestGroup:
    """One user request: its prompt and its `n` engine requests."""

    request_id: str
    prompt: str | None
    children: list[Request]
    detokenizers: list[IncrementalDetokenizer]


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        config.cache.validate()
        config.scheduler.validate()
        ops.set_backend(config.kernels.backend)
        path = config.model.path
        if path is None:
            from tritonllm.models.tiny import tiny_model_path

            path = str(tiny_model_path("LlamaForCausalLM"))
        self.model_path = path
        self.dtype = config.model.torch_dtype()
        self.device = platform.DEVICE
        self.model, self.hf_config = load_model(path, self.dtype, self.device)
        self.tokenizer = load_tokenizer(config.model.tokenizer or path)
        self.eos_token_ids = frozenset(load_eos_token_ids(path, self.hf_config))

        model_max_len = getattr(self.hf_config, "max_position_embeddings", None) or 2048
        self.max_model_len = config.model.max_model_len or model_max_len
        if self.max_model_len > model_max_len:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's max_position_embeddings ({model_max_len}):"
                " lower max_model_len"
            )
        sched = config.scheduler
        if not sched.enable_chunked_prefill and sched.max_num_batched_tokens < self.max_model_len:
            # whole-prompt prefills must fit one step
            sched.max_num_batched_tokens = self.max_model_len

        block_size = config.cache.block_size
        self.runner = ModelRunner(
            self.model, self.dtype, self.device, block_size, config.cache.torch_kv_dtype(self.dtype)
        )
        num_blocks = self._num_kv_blocks()
        capacity = num_blocks * block_size
        if self.max_model_len > capacity:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the KV cache ({capacity:,} tokens): lower max_model_len"
                " or raise gpu_memory_utilization / num_gpu_blocks_override"
            )
        self.runner.allocate_kv_cache(num_blocks)
        if not config.enforce_eager and platform.is_gpu():
            self.runner.enable_decode_graphs(sched.max_num_seqs, self.max_model_len)
        logger.info(
            "KV cache (%s): %d blocks x %d = %s tokens; max concurrency at max_model_len %d: %.1fx",
            self.runner.kv_dtype,
            num_blocks,
            block_size,
            f"{capacity:,}",
            self.max_model_len,
            capacity / self.max_model_len,
        )
        self.kv_cache = KVCacheManager(num_blocks, block_size, config.cache.enable_prefix_caching)
        self.scheduler = Scheduler(sched, self.kv_cache)
        self.groups: dict[str, RequestGroup] = {}
        self._rng = random.Random(config.model.seed)
        self.stats = EngineStats()

    def _num_kv_blocks(self) -> int:
        cache = self.config.cache
        if cache.num_gpu_blocks_override is not None:
            return cache.num_gpu_blocks_override
        if not platform.is_gpu():
            return cdiv(cache.cpu_kv_cache_tokens, cache.block_size)
        # As vLLM: the utilization share of the card, less the peak of a profiling step at the
        # largest batch (weights + activations), and less what other processes and the CUDA context hold.
        sched = self.config.scheduler
        peak = self.runner.profile_peak_bytes(sched.max_num_batched_tokens, sched.max_num_seqs)
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
        if request_id in self.groups:
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
        detoks = [IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens) for _ in children]
        self.groups[request_id] = RequestGroup(request_id, prompt, children, detoks)
        for child in children:
            self.scheduler.add_request(child)

    def abort_request(self, request_id: str) -> None:
        group = self.groups.pop(request_id, None)
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
        return self.scheduler.has_unfinished()

    # ---- the step ------------------------------------------------------------------------

    def step(self, finished_only: bool = False) -> list[RequestOutput]:
        """Run one scheduled step; returns the outputs of the groups it advanced (a finished group is
        last seen here), or of the groups it finished only (offline use: no per-step copies)."""
        sched = self.scheduler.schedule()
        self.stats.steps.append(
            StepStats(
                num_scheduled_tokens=sched.num_batched_tokens,
                num_running=len(self.scheduler.running),
                num_waiting=len(self.scheduler.waiting),
                kv_cache_usage=self.kv_cache.usage,
                num_preempted=len(sched.preempted),
            )
        )
        if sched.is_empty:
            return []
        result = self.runner.execute(sched, self.kv_cache)
        now = time.monotonic()
        touched: dict[str, RequestGroup] = {}
        for s in sched.scheduled:
            r = s.request
            if r.num_computed_tokens < r.num_prompt_tokens:
                self.stats.prompt_tokens += min(s.num_new_tokens, r.num_prompt_tokens - r.num_computed_tokens)
            r.num_computed_tokens += s.num_new_tokens
            self.kv_cache.cache_computed_blocks(r)
            group = self.groups[self._group_id(r)]
            if r.request_id in result.prompt_logprobs:
                self._append_prompt_logprobs(r, *result.prompt_logprobs[r.request_id])
            if r.request_id in result.sampled:
                self._append_token(r, group, result, now)
            touched[group.request_id] = group
        outputs = []
        for group in touched.values():
            finished = all(c.is_finished for c in group.children)
            if finished or not finished_only:
                outputs.append(self._make_output(group))
            if finished:
                del self.groups[group.request_id]
        return outputs

    @staticmethod
    def _group_id(request: Request) -> str:
        return request.request_id.rsplit("#", 1)[0] if request.params.n > 1 else request.request_id

    def _append_prompt_logprobs(self, r: Request, first_pos: int, top) -> None:
        for j in range(len(top.token_logprobs)):
            token = r.prompt_token_ids[first_pos + j]
            entry = self._logprob_dict(
                top.top_ids[j], top.top_logprobs[j], token, top.token_logprobs[j], top.token_ranks[j]
            )
            r.prompt_logprobs.append(entry)

    def _logprob_dict(self, ids: list[int], lps: list[float], token: int, token_lp: float, rank: int) -> dict:
        entry = {token: Logprob(token_lp, rank, self.tokenizer.decode([token]))}
        for i, (tid, lp) in enumerate(zip(ids, lps)):
            if tid not in entry:
                entry[tid] = Logprob(lp, i + 1, self.tokenizer.decode([tid]))
        return entry

    def _append_token(self, r: Request, group: RequestGroup, result: StepResult, now: float) -> None:
        token = result.sampled[r.request_id]
        r.output_token_ids.append(token)
        self.stats.generation_tokens += 1
        if r.times.first_token is None:
            r.times.first_token = now
        if r.request_id in result.sampled_logprobs:
            ids, lps, token_lp, rank = result.sampled_logprobs[r.request_id]
            r.logprobs.append(self._logprob_dict(ids, lps, token, token_lp, rank))
            r.cumulative_logprob += token_lp
        p = r.params
        new_text = group.detokenizers[group.children.index(r)].append(token) if p.detokenize else ""
        r.output_text += new_text
        status = None
        num_out = len(r.output_token_ids)
        if num_out >= p.min_tokens:
            if not p.ignore_eos and token in r.eos_token_ids:
                status = RequestStatus.FINISHED_STOPPED
            elif token in p.stop_token_ids:
                status, r.stop_reason = RequestStatus.FINISHED_STOPPED, token
            elif p.stop_strings and new_text:
                hit = find_stop_string(r.output_text, len(new_text), p.stop_strings)
                if hit is not None:
                    stop, index = hit
                    r.output_text = r.output_text[: index + (len(stop) if p.include_stop_str_in_output else 0)]
                    status, r.stop_reason = RequestStatus.FINISHED_STOPPED, stop
        if status is None and (num_out >= r.max_tokens or r.num_tokens >= self.max_model_len):
            status = RequestStatus.FINISHED_LENGTH
        if status is not None:
            self.scheduler.finish(r, status)
            t = r.times
            self.stats.record_finished(t.arrival, t.first_scheduled, t.first_token, t.finished, num_out)

    def _make_output(self, group: RequestGroup) -> RequestOutput:
        first = group.children[0]
        completions = [
            CompletionOutput(
                index=i,
                text=c.output_text,
                token_ids=list(c.output_token_ids),
                cumulative_logprob=c.cumulative_logprob if c.params.logprobs is not None else None,
                logprobs=list(c.logprobs) if c.params.logprobs is not None else None,
                finish_reason=c.status.value if c.is_finished else None,
                stop_reason=c.stop_reason,
            )
            for i, c in enumerate(group.children)
        ]
        return RequestOutput(
            request_id=group.request_id,
            prompt=group.prompt,
            prompt_token_ids=first.prompt_token_ids,
            prompt_logprobs=list(first.prompt_logprobs) if first.params.prompt_logprobs is not None else None,
            outputs=completions,
            finished=all(c.is_finished for c in group.children),
            metrics=RequestMetrics(
                arrival_time=first.times.arrival,
                first_scheduled_time=first.times.first_scheduled,
                first_token_time=min(
                    (c.times.first_token for c in group.children if c.times.first_token), default=None
                ),
                finished_time=first.times.finished,
            ),
        )
