"""Engine configuration as plain dataclasses, usable with or without Hydra.

Hydra's `configs/` tree mirrors these groups one to one; `EngineConfig.from_dict` builds them
from a Hydra/OmegaConf mapping, and `LLM(...)` builds them from vLLM-style keyword arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from tritonllm import platform

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class ModelConfig:
    path: str | None = None  # HF folder; None runs the tiny built-in Llama
    tokenizer: str | None = None  # defaults to `path`
    dtype: str = "auto"  # auto: bfloat16 on a GPU, float32 on CPU
    max_model_len: int | None = None  # defaults to the model's max_position_embeddings (or its RoPE-scaled context)
    seed: int = 0
    # online quantization of a float checkpoint: "fp8", "int8", "mxfp8" or "int4" (quantization/config.py); a
    # quantized checkpoint is read as its config.json says (then leave this unset, or give its method)
    quantization: str | None = None
    # "auto": the folder's safetensors (or GGUF file); "dummy": random weights made on the device in the
    # checkpoint's own layout (loader/random_weights.py), for benchmarks of models without their files
    load_format: str = "auto"

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return platform.DEFAULT_DTYPE
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not one of {['auto', *_DTYPES]}")
        dtype = _DTYPES[self.dtype]
        if dtype == torch.bfloat16 and not platform.is_gpu():
            raise ValueError("dtype='bfloat16' needs a GPU (Triton's interpreter lacks bf16 dot): use float32")
        return dtype


KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")


@dataclass
class CacheConfig:
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    cpu_kv_cache_tokens: int = 65536  # KV capacity on CPU when no override is given
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"  # or "fp8" (= "fp8_e4m3"): half the KV memory and decode bytes
    # FP8 cache: set each layer's K/V scales from the first prompt step's K/V (amax / 448) instead of
    # the checkpoint's scales (or 1.0 where it has none)
    calculate_kv_scales: bool = False

    def validate(self) -> None:
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size={self.block_size} must be a power of two")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override <= 0:
            raise ValueError(f"num_gpu_blocks_override={self.num_gpu_blocks_override} must be positive")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype={self.kv_cache_dtype!r} is not one of {KV_CACHE_DTYPES}")
        if self.calculate_kv_scales and self.kv_cache_dtype == "auto":
            raise ValueError("calculate_kv_scales needs an FP8 KV cache: set kv_cache_dtype='fp8'")

    def torch_kv_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """auto: the model's dtype; fp8: e4m3 (e4m3fnuz on AMD MI300), with per-layer scales."""
        return model_dtype if self.kv_cache_dtype == "auto" else platform.fp8_e4m3_dtype()


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"
    # overlap scheduling: schedule step N+1 and process step N's outputs while the GPU runs step N+1
    # (None: on with a GPU, off on CPU)
    async_scheduling: bool | None = None
    # a step with a new prompt's prefill that would overshoot one of the padded token counts the forward
    # runs at (the piecewise graphs' sizes) by less than it falls short of the next takes fewer of that
    # prompt's tokens and ends on the size; the rest goes in the next step. On the H200 (Llama-3-8B, bf16)
    # 13 decodes + a 512-token prompt (525 tokens) took 16.2-18.1 ms a step, 13 + 499 (512) 12.8-13.1 ms
    # (experiments/serving/README.md); false: prompts are never shortened below the budget (ablation)
    align_prefill_chunks: bool = True

    def validate(self) -> None:
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs={self.max_num_seqs} must be positive")
        if self.max_num_batched_tokens <= 0:
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens} must be positive")
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(f"policy={self.policy!r} is not one of ['fcfs', 'priority']")


@dataclass
class KernelConfig:
    """Which implementation serves each op (kernels/registry.py): a registered name, or "auto" (the
    highest-priority one that supports the model's dtype, KV cache dtype, head size and platform).
    `backend` fills the ops left at "auto": "triton" keeps auto, "torch_ref" (or any name every op
    registers) picks that implementation for them."""

    backend: str = "triton"
    attention: str = "auto"
    rms_norm: str = "auto"
    rotary: str = "auto"
    activation: str = "auto"
    kv_write: str = "auto"
    rope_kv_write: str = "auto"
    sampling: str = "auto"
    linear: str = "auto"
    moe: str = "auto"

    @classmethod
    def from_choices(cls, backend: str, choices: dict[str, str]) -> KernelConfig:
        ops = {f.name for f in fields(cls)} - {"backend"}
        unknown = set(choices) - ops
        if unknown:
            raise ValueError(f"unknown kernel op(s) {sorted(unknown)}; ops: {sorted(ops)}")
        return cls(backend=backend, **choices)

    def default(self) -> str:
        return "auto" if self.backend == "triton" else self.backend

    def choices(self) -> dict[str, str]:
        """The ops set to a name (not "auto")."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "backend" and getattr(self, f.name) != "auto"
        }


LAUNCHERS = ("spawn", "torchrun")


@dataclass
class ParallelConfig:
    """Tensor parallelism (distributed/): the model split across `tensor_parallel_size` GPUs (CPU
    processes in tests), one process each. Rank 0 runs the engine; the others are spawned by it
    ("spawn"), or started by torchrun with the same program ("torchrun": every rank builds the LLM,
    ranks > 0 serve as workers until rank 0 shuts down; multi-host)."""

    tensor_parallel_size: int = 1
    launcher: str = "spawn"
    # a collective waiting longer than this fails (a stuck rank) instead of hanging; also the wait
    # for the workers to start
    timeout_s: float = 600.0

    def validate(self) -> None:
        if self.tensor_parallel_size <= 0:
            raise ValueError(f"tensor_parallel_size={self.tensor_parallel_size} must be positive")
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher={self.launcher!r} is not one of {list(LAUNCHERS)}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s={self.timeout_s} must be positive")


_ENGINE_FLAGS = (
    "enforce_eager",
    "piecewise_graphs",
    "piecewise_rope_kv_write",
    "pdl",
    "gc_freeze",
    "fuse_rope_kv_write",
    "fold_rope_into_attention",
    "fuse_attention_epilogue",
    "decode_group_quant",
    "fuse_gated_activation",
    "fuse_down_input_quant",
    "fuse_norm_into_gemm",
    "fuse_moe_router",
    "fuse_norm_into_router",
    "prefetch_weights",
)  # EngineConfig's booleans outside the groups
_ENGINE_INTS = ("piecewise_first_size",)  # and its integers


@dataclass
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    kernels: KernelConfig = field(default_factory=KernelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    enforce_eager: bool = False  # on a GPU, decode steps replay CUDA/HIP graphs (worker/cuda_graph.py)
    # on a GPU without enforce_eager, prefill and mixed steps replay piecewise graphs: everything but
    # attention (worker/piecewise_graph.py); false: those steps run eagerly (ablation)
    piecewise_graphs: bool = True
    # the piecewise graphs' padded token counts: multiples of this up to 8 x it, then four a doubling up to
    # max_num_batched_tokens (worker/piecewise_graph.py's piecewise_sizes); a step of n tokens runs the
    # graphs of the next size up, so this bounds the padding of mixed steps, e.g. a 512-token prompt
    # arriving beside 13 decodes (525 tokens) ran at 768 with 256
    piecewise_first_size: int = 128
    # true: the piecewise graphs hold each layer's fused RoPE + KV write (over static positions and slots), so
    # the eager work between two graphs is attention alone; false (the default: on the H200 it was no
    # faster, session 45): the RoPE + KV write runs eagerly beside attention
    piecewise_rope_kv_write: bool = False
    # on NVIDIA sm90+, the hot-path Triton kernels launch with programmatic dependent launch: each may
    # start while the one before it finishes (kernels/launch.py); false: plain launches (ablation)
    pdl: bool = True
    # after start-up, collect once and freeze the surviving objects out of Python's cyclic GC, so that
    # full collections while serving do not walk them (engine/host_gc.py); false: leave the GC as it is
    gc_freeze: bool = True
    # each attention layer's RoPE and KV-cache write in one kernel (the rope_kv_write op) instead of two
    # launches; false: the rotary kernel, then the KV write (ablation)
    fuse_rope_kv_write: bool = True
    # with fuse_rope_kv_write, a split-KV decode step (few sequences: batch 1 to a few) folds that kernel into the
    # attention: each split program rotates its query rows and the one holding the newest key rotates and writes
    # it and its value (kernels/attention_rope.py): one launch and one PDL hand-off fewer a layer. Opt-in until a GPU
    # has timed it (built in session 52 without one; bit-equal on the CPU); false: the rope_kv_write kernel first
    fold_rope_into_attention: bool = False
    # split-KV decode: the split kernel merges its partial results itself and, before a W8A8 o_proj,
    # quantizes the attention output (kernels/attention_split.py); false: a merge kernel, then a
    # quantization kernel (ablation)
    fuse_attention_epilogue: bool = True
    # at decode sizes (up to linear.GROUP_INPUT_MAX_M tokens), where an FP8 W8A8 layer's linear implementation asks for
    # it (triton / triton_sm90: input_quant), the op before quantizes the layer's input per 1 x 128 group instead of
    # per token, and the GEMM applies the scales a K step at a time: before o_proj each KV head's merging program in
    # the split-KV kernel quantizes its own heads (no program waits for the token's whole row), before down_proj
    # the quantizing SiLU-mul spreads a row over many programs instead of one. Finer scales, so at least as
    # accurate; false: per token (ablation)
    decode_group_quant: bool = True
    # a gated MLP's SiLU-mul in the gate_up GEMM's epilogue where the linear implementation has such a
    # kernel (triton_sm90's skinny GEMM); off by default: on the H200 at batch 1 the epilogue cost more
    # than the activation kernel it saves, which PDL overlaps with the next GEMM's weight copies
    # (experiments/gemm/README.md, session 18); for 4-bit weights (the W4 GEMV's GATED build) no measurable gain
    # on the H200 (experiments/quant4/README.md, session 40); true: the ablation's other arm
    fuse_gated_activation: bool = False
    # a W8A8 down projection at decode sizes quantizes its input in its own GEMM (triton_sm90's skinny GEMM,
    # XQ mode) after a many-program SiLU-mul, instead of the SiLU-mul kernel quantizing each row in one
    # program (kernels/linear.py's silu_mul_linear_sm90); false: the quantizing SiLU-mul kernel (ablation).
    # With fuse_gated_activation as well: gate_up's epilogue writes h and its block amaxes and down quantizes h
    # from them, no activation kernel between the two GEMMs (gated_mlp_linear_sm90; not yet timed)
    fuse_down_input_quant: bool = False
    # at decode sizes, an FP8 W8A8 qkv / gate_up GEMM normalizes and quantizes the residual stream itself
    # (triton_sm90's skinny GEMM, XN mode) and o_proj / down_proj add their outputs into the stream in their
    # epilogues, so no RMSNorm kernel runs between the layers (kernels/linear.py's norm_linear_sm90 and
    # residual_linear_sm90); false: the fused add + RMSNorm + quantization kernel (ablation)
    fuse_norm_into_gemm: bool = False
    # at decode sizes (up to moe_route.FUSED_ROUTER_TOKENS tokens) a MoE block's router linear layer and its
    # routing run as one kernel (the moe op's router_route, kernels/moe_route.py) instead of the router's GEMM
    # and the routing kernel: gpt-oss-20b batch-1 TPOT 2.722 -> 2.639 ms on an H100 (session 29); false: ablation
    fuse_moe_router: bool = True
    # with fuse_moe_router, at one or two tokens the decoder layer's residual add and RMSNorm before a MoE block run
    # in the router's launch (the moe op's norm_router_route, kernels/moe_route.py): the norm kernel's launch saved a
    # layer; opt-in until timed on a GPU
    fuse_norm_into_router: bool = False
    # NVIDIA sm90+: decode steps of up to prefetch.MAX_PREFETCH_SEQS (1) sequences stream o_proj's weight into L2 during
    # attention and the next layer's qkv weight during an MoE block's second expert GEMV (layers/prefetch.py,
    # kernels/l2_prefetch.py): Llama-3-8B int4 batch 1 +3.2%, gpt-oss-20b +1.4-1.7% on an H100; false: ablation
    prefetch_weights: bool = True

    @staticmethod
    def from_dict(values: dict[str, Any]) -> EngineConfig:
        """Build from a nested mapping (e.g. a Hydra config's `engine` node); unknown keys are refused."""
        groups = {
            "model": ModelConfig, "cache": CacheConfig, "scheduler": SchedulerConfig, "kernels": KernelConfig,
            "parallel": ParallelConfig,
        }  # fmt: skip
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            if key in groups:
                allowed = {f.name for f in fields(groups[key])}
                unknown = set(value) - allowed
                if unknown:
                    raise ValueError(f"unknown {key} option(s) {sorted(unknown)}; known: {sorted(allowed)}")
                kwargs[key] = groups[key](**value)
            elif key in _ENGINE_FLAGS:
                kwargs[key] = bool(value)
            elif key in _ENGINE_INTS:
                kwargs[key] = int(value)
            else:
                known = sorted([*groups, *_ENGINE_FLAGS, *_ENGINE_INTS])
                raise ValueError(f"unknown engine option {key!r}; known: {known}")
        return EngineConfig(**kwargs)
