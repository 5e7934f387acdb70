"""Everything a rank sets up before serving: its model (shard), kernels, runner and KV cache.

The engine (rank 0) and every tensor-parallel follower run this same sequence from the same config,
so the collectives it contains (the GPU profiling step's forward, graph capture, warm-up) meet in
the same order on every rank, and the KV cache gets the same number of blocks everywhere (the
smallest any rank can hold: block tables are shared).
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig

from tritonllm import platform
from tritonllm.config import EngineConfig, SchedulerConfig
from tritonllm.distributed.parallel_state import TensorParallel
from tritonllm.engine.kv_cache import cdiv
from tritonllm.kernels.launch import set_pdl
from tritonllm.kernels.registry import OPS, KernelContext, Kernels, select_kernels
from tritonllm.layers.activation import SiluAndMul
from tritonllm.layers.attention import Attention
from tritonllm.layers.moe import FusedMoE
from tritonllm.layers.prefetch import WeightPrefetch
from tritonllm.models.llama import LlamaDecoderLayer
from tritonllm.models.loader import fit_rope_tables, layer_features, linear_formats, load_model, model_max_len, used_ops
from tritonllm.worker.model_runner import ModelRunner

# the ops a piecewise graph's pieces hold (attention runs eagerly between them; the fused RoPE + KV write is
# captured where its implementation allows, else it runs eagerly too)
PIECEWISE_OPS = ("rms_norm", "rotary", "activation", "linear", "moe")
logger = logging.getLogger(__name__)


@dataclass
class RankSetup:
    model: nn.Module
    hf_config: PretrainedConfig
    kernels: Kernels
    runner: ModelRunner
    max_model_len: int
    num_blocks: int


def set_up_rank(config: EngineConfig, path: str, tp: TensorParallel) -> RankSetup:
    """Load this rank's model from `path` and make its runner ready to serve (KV cache allocated,
    graphs captured and kernels compiled on a GPU). May raise max_num_batched_tokens in `config`
    (chunked prefill off: whole prompts must fit one step)."""
    dtype = config.model.torch_dtype()
    device = platform.DEVICE
    model, hf_config = load_model(path, dtype, device, config.model.quantization, config.model.load_format, tp=tp)
    kv_dtype = config.cache.torch_kv_dtype(dtype)
    for module in model.modules():
        if isinstance(module, Attention):
            module.fuse_rope_kv_write = config.fuse_rope_kv_write
            module.fold_rope = config.fold_rope_into_attention
            module.fuse_epilogue = config.fuse_attention_epilogue
            module.group_quant = config.decode_group_quant
        elif isinstance(module, SiluAndMul):
            module.fuse_gemm = config.fuse_gated_activation
            module.fuse_down_input = config.fuse_down_input_quant
            module.group_quant = config.decode_group_quant
        elif isinstance(module, LlamaDecoderLayer):
            module.fuse_norm = config.fuse_norm_into_gemm
        elif isinstance(module, FusedMoE):
            module.fuse_router = config.fuse_moe_router
            module.fuse_norm = config.fuse_norm_into_router
    # this engine's kernels, bound to its model's layers by the runner: another engine in the same
    # process may choose others
    context = KernelContext(
        platform.PLATFORM, dtype, kv_dtype, getattr(model, "head_dim", None), linear_formats(model),
        layer_features(model),
    )  # fmt: skip
    kernels = select_kernels(config.kernels.choices(), context, default=config.kernels.default())
    logger.info("kernels: %s", kernels.choice)
    if config.pdl and not set_pdl(True):
        logger.info("programmatic dependent launch off: it needs an NVIDIA GPU of compute capability 9.0+")
    elif not config.pdl:
        set_pdl(False)

    longest = model_max_len(hf_config)
    max_model_len = config.model.max_model_len or longest
    if max_model_len > longest:
        raise ValueError(
            f"max_model_len={max_model_len} exceeds the model's maximum length ({longest}: "
            "max_position_embeddings, extended by its RoPE scaling if any): lower max_model_len"
        )
    fit_rope_tables(model, max_model_len)
    sched = config.scheduler
    if not sched.enable_chunked_prefill and sched.max_num_batched_tokens < max_model_len:
        # whole-prompt prefills must fit one step
        logger.info(
            "chunked prefill off: max_num_batched_tokens raised from %d to max_model_len %d",
            sched.max_num_batched_tokens, max_model_len,
        )  # fmt: skip
        sched.max_num_batched_tokens = max_model_len

    block_size = config.cache.block_size
    runner = ModelRunner(
        model, dtype, device, block_size, kv_dtype,
        max_num_seqs=sched.max_num_seqs, max_model_len=max_model_len,
        max_num_batched_tokens=sched.max_num_batched_tokens, kernels=kernels, tp=tp,
    )  # fmt: skip
    if config.prefetch_weights:
        prefetch = WeightPrefetch(device)
        if prefetch.enabled:
            runner.weight_prefetch = prefetch
            logger.info("weight prefetch into L2: %d linear layers linked", prefetch.link(model))
        else:
            logger.info("weight prefetch off: it needs an NVIDIA GPU of compute capability 9.0+")
    num_blocks = tp.min_over_ranks(num_kv_blocks(config, runner))
    capacity = num_blocks * block_size
    if max_model_len > capacity:
        raise ValueError(
            f"max_model_len {max_model_len} exceeds the KV cache ({capacity:,} tokens): lower max_model_len"
            " or raise gpu_memory_utilization / num_gpu_blocks_override"
        )
    runner.allocate_kv_cache(num_blocks)
    if not config.enforce_eager and platform.is_gpu():
        enable_graphs(config, sched, model, kernels, runner, max_model_len)
    if platform.is_gpu():
        runner.warm_up()  # Triton compiles prefill kernels now, not in the first generate
    if config.cache.calculate_kv_scales:
        runner.calibrate_kv_scales()
    logger.info(
        "KV cache (%s): %d blocks x %d = %s tokens; max concurrency at max_model_len %d: %.1fx",
        runner.kv_dtype, num_blocks, block_size, f"{capacity:,}", max_model_len, capacity / max_model_len,
    )  # fmt: skip
    return RankSetup(model, hf_config, kernels, runner, max_model_len, num_blocks)


def enable_graphs(
    config: EngineConfig, sched: SchedulerConfig, model: nn.Module, kernels: Kernels, runner: ModelRunner,
    max_model_len: int,
) -> None:  # fmt: skip
    """Decode graphs hold the whole step; piecewise graphs everything of a forward but attention
    and the KV write. A chosen implementation that cannot be captured turns off the graphs that
    would hold it (logged), so e.g. kernels.attention=torch_ref runs decode steps eagerly."""
    used = used_ops(model)
    no_decode = kernels.uncapturable(op for op in OPS if op in used)
    no_piecewise = kernels.uncapturable(op for op in PIECEWISE_OPS if op in used)
    if no_decode:
        logger.info("decode graphs off: kernels %s cannot be captured (they sync with the host)", no_decode)
    else:
        runner.enable_decode_graphs(sched.max_num_seqs, max_model_len)
    if not config.piecewise_graphs:
        return
    if no_piecewise:
        logger.info("piecewise graphs off: kernels %s cannot be captured (they sync with the host)", no_piecewise)
        return
    # Their pool holds about one max_num_batched_tokens forward's activations for good. The
    # KV cache was sized to leave the profiled peak of such a step (weights, activations,
    # logits, sampling) free, so capture fits; the logits and sampling of later steps then
    # come on top of the pool, out of the 1 - gpu_memory_utilization share.
    # the fused RoPE + KV write inside the graphs where its kernel can be captured (else eager, with attention)
    rope_kv_write = config.piecewise_rope_kv_write and not kernels.uncapturable(["rope_kv_write"])
    runner.enable_piecewise_graphs(
        sched.max_num_batched_tokens, first_size=config.piecewise_first_size, rope_kv_write=rope_kv_write
    )


def profile_peak_bytes(runner: ModelRunner, sched: SchedulerConfig) -> int:
    """The profiling step's peak; one that does not fit the GPU is refused with what it needed and
    the fix, instead of a raw CUDA out-of-memory error."""
    free_before, total = torch.cuda.mem_get_info(runner.device)
    try:
        return runner.profile_peak_bytes(sched.max_num_batched_tokens, sched.max_num_seqs)
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


def num_kv_blocks(config: EngineConfig, runner: ModelRunner) -> int:
    """The KV blocks this rank's memory holds."""
    cache = config.cache
    if cache.num_gpu_blocks_override is not None:
        return cache.num_gpu_blocks_override
    if not platform.is_gpu():
        return cdiv(cache.cpu_kv_cache_tokens, cache.block_size)
    # As vLLM: the utilization share of the card, less the peak of a profiling step at the
    # largest batch (weights + activations), and less what other processes and the CUDA context hold.
    gc.collect()  # engines dropped before this one (reference cycles) give their memory back first
    torch.cuda.empty_cache()
    peak = profile_peak_bytes(runner, config.scheduler)
    free, total = torch.cuda.mem_get_info(runner.device)
    others = max(0, (total - free) - torch.cuda.memory_reserved(runner.device))
    available = total * cache.gpu_memory_utilization - peak - others
    num_blocks = int(available // runner.kv_bytes_per_block())
    if num_blocks <= 0:
        raise ValueError(
            f"no GPU memory left for the KV cache: the profiling step peaked at {peak / 2**30:.1f} GiB of"
            f" {total / 2**30:.1f} GiB x gpu_memory_utilization {cache.gpu_memory_utilization}:"
            " raise gpu_memory_utilization or lower max_num_batched_tokens / max_num_seqs"
        )
    return num_blocks
