"""The offline API, mirroring vLLM's `LLM`: generate(), chat()."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from tritonllm.config import CacheConfig, EngineConfig, KernelConfig, ModelConfig, ParallelConfig, SchedulerConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.outputs import RequestOutput
from tritonllm.sampling_params import RequestOutputKind, SamplingParams

PromptType = str | dict[str, Any]


class PromptRejectedError(ValueError):
    """Some prompts of a `generate` call were refused; the others ran to completion.

    `errors` maps the index of each refused prompt to the reason; `outputs` holds one entry per
    prompt, in order (None for the refused ones), so no finished work is lost."""

    def __init__(self, errors: dict[int, str], outputs: list[RequestOutput | None]) -> None:
        self.errors = errors
        self.outputs = outputs
        reasons = "; ".join(f"prompt {i}: {reason}" for i, reason in errors.items())
        done = sum(o is not None for o in outputs)
        super().__init__(f"{len(errors)} prompt(s) rejected ({reasons}); the other {done} finished (see .outputs)")


class LLM:
    def __init__(
        self,
        model: str | None = None,
        tokenizer: str | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.9,
        block_size: int = 16,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        enable_prefix_caching: bool = True,
        enable_chunked_prefill: bool = True,
        enforce_eager: bool = False,
        piecewise_graphs: bool = True,
        piecewise_first_size: int = 128,
        piecewise_rope_kv_write: bool = False,
        pdl: bool = True,
        gc_freeze: bool = True,
        fuse_rope_kv_write: bool = True,
        fold_rope_into_attention: bool = False,
        fuse_attention_epilogue: bool = True,
        decode_group_quant: bool = True,
        fuse_gated_activation: bool = False,
        fuse_down_input_quant: bool = False,
        fuse_norm_into_gemm: bool = False,
        fuse_moe_router: bool = True,
        fuse_norm_into_router: bool = False,
        prefetch_weights: bool = True,
        quantization: str | None = None,
        load_format: str = "auto",
        kv_cache_dtype: str = "auto",
        calculate_kv_scales: bool = False,
        seed: int = 0,
        num_gpu_blocks_override: int | None = None,
        scheduling_policy: str = "fcfs",
        align_prefill_chunks: bool = True,
        kernel_backend: str = "triton",
        async_scheduling: bool | None = None,
        kernels: dict[str, str] | None = None,
        tensor_parallel_size: int = 1,
        distributed_launcher: str = "spawn",
    ) -> None:
        """`kernels`: per op, a registered implementation (kernels/registry.py), e.g.
        {"attention": "torch_ref"}; ops left out take `kernel_backend` ("triton": the best one).
        `tensor_parallel_size`: split the model across that many GPUs, one process each (config.py's
        ParallelConfig; `distributed_launcher` "torchrun": the processes are torchrun's). Call
        `shutdown()` to stop the worker processes before starting another such LLM in this process."""
        config = EngineConfig(
            model=ModelConfig(
                path=model,
                tokenizer=tokenizer,
                dtype=dtype,
                max_model_len=max_model_len,
                seed=seed,
                quantization=quantization,
                load_format=load_format,
            ),  # fmt: skip
            cache=CacheConfig(
                block_size=block_size,
                gpu_memory_utilization=gpu_memory_utilization,
                num_gpu_blocks_override=num_gpu_blocks_override,
                enable_prefix_caching=enable_prefix_caching,
                kv_cache_dtype=kv_cache_dtype,
                calculate_kv_scales=calculate_kv_scales,
            ),
            scheduler=SchedulerConfig(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                enable_chunked_prefill=enable_chunked_prefill,
                policy=scheduling_policy,
                async_scheduling=async_scheduling,
                align_prefill_chunks=align_prefill_chunks,
            ),
            kernels=KernelConfig.from_choices(kernel_backend, kernels or {}),
            parallel=ParallelConfig(tensor_parallel_size=tensor_parallel_size, launcher=distributed_launcher),
            enforce_eager=enforce_eager,
            piecewise_graphs=piecewise_graphs,
            piecewise_first_size=piecewise_first_size,
            piecewise_rope_kv_write=piecewise_rope_kv_write,
            pdl=pdl,
            gc_freeze=gc_freeze,
            fuse_rope_kv_write=fuse_rope_kv_write,
            fold_rope_into_attention=fold_rope_into_attention,
            fuse_attention_epilogue=fuse_attention_epilogue,
            decode_group_quant=decode_group_quant,
            fuse_gated_activation=fuse_gated_activation,
            fuse_down_input_quant=fuse_down_input_quant,
            fuse_norm_into_gemm=fuse_norm_into_gemm,
            fuse_moe_router=fuse_moe_router,
            fuse_norm_into_router=fuse_norm_into_router,
            prefetch_weights=prefetch_weights,
        )
        self._start(config)

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm._start(config)
        return llm

    def _start(self, config: EngineConfig) -> None:
        self.llm_engine = LLMEngine(config)
        self._counter = itertools.count()

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker processes (nothing to do with tensor_parallel_size 1)."""
        self.llm_engine.shutdown()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def _to_token_ids(self, prompt: PromptType) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            return self.llm_engine.tokenizer.encode(prompt), prompt
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
            if not all(isinstance(t, int) for t in ids):
                raise ValueError("prompt_token_ids must be a list of integers")
            return list(ids), prompt.get("prompt")
        if isinstance(prompt, dict) and "prompt" in prompt:
            return self.llm_engine.tokenizer.encode(prompt["prompt"]), prompt["prompt"]
        raise ValueError(
            f"a prompt is a string or a dict with 'prompt_token_ids' (or 'prompt'), got {type(prompt).__name__}"
        )

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion. A prompt the engine refuses (too long, empty, bad token
        ids) does not stop the others: they finish, then `PromptRejectedError` (a ValueError) is
        raised, carrying their outputs."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(
                    f"sampling_params has {len(params_list)} entries for {len(prompts)} prompts: give one or one per prompt"
                )
        # only the final outputs are read: texts are decoded once, at the end (as vLLM's LLM does)
        final = {id(p): dataclasses.replace(p, output_kind=RequestOutputKind.FINAL_ONLY) for p in params_list}
        params_list = [final[id(p)] for p in params_list]
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"priority has {len(priority)} entries for {len(prompts)} prompts: give one per prompt")
        engine = self.llm_engine
        ids: list[str | None] = []
        errors: dict[int, str] = {}
        for i, (prompt, params) in enumerate(zip(prompts, params_list)):
            request_id = str(next(self._counter))
            try:
                token_ids, text = self._to_token_ids(prompt)
                engine.add_request(
                    request_id, token_ids, params, prompt=text, priority=priority[i] if priority is not None else None
                )
                ids.append(request_id)
            except ValueError as e:
                errors[i] = str(e)
                ids.append(None)
        try:
            finished = self._run_engine([i for i in ids if i is not None], use_tqdm)
        except BaseException:
            for request_id in ids:  # a failed step aborted them already; an interrupt did not
                if request_id is not None:
                    engine.abort_request(request_id)
            raise
        outputs = [finished[i] if i is not None else None for i in ids]
        if errors:
            raise PromptRejectedError(errors, outputs)
        return outputs

    def get_metrics(self):
        """Engine metrics (objects with `.name` and `.value`), vLLM-style names under `tritonllm:`."""
        return self.llm_engine.get_metrics()

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix block not in use (e.g. between benchmark runs)."""
        return self.llm_engine.reset_prefix_cache()

    def _run_engine(self, ids: list[str], use_tqdm: bool) -> dict[str, RequestOutput]:
        engine = self.llm_engine
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Processed prompts", dynamic_ncols=True) if use_tqdm else None
        start = time.perf_counter()
        prompt0, gen0 = engine.stats.prompt_tokens, engine.stats.generation_tokens
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = out
                    if bar is not None:
                        elapsed = time.perf_counter() - start
                        bar.set_postfix_str(
                            f"input: {(engine.stats.prompt_tokens - prompt0) / elapsed:.1f} tok/s, "
                            f"output: {(engine.stats.generation_tokens - gen0) / elapsed:.1f} tok/s"
                        )
                        bar.update(1)
        if bar is not None:
            bar.close()
        return finished

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tok = self.llm_engine.tokenizer
        prompts = []
        for conversation in conversations:
            ids = tok.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            prompts.append({"prompt_token_ids": list(ids)})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)
