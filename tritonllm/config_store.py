"""Hydra schemas: every config group of `configs/` is typed by its dataclass, so a wrong key or a
value of the wrong type fails with Hydra's own message while the config is composed, before
anything runs (`cache.block_size=big`: "Value 'big' of type 'str' could not be converted to
Integer"; `workload.num_request=5`: "Key 'num_request' not in 'RandomWorkload'").

Each YAML option lists its schema first in its defaults (`defaults: [schema_random, _self_]`);
`register_schemas()` puts the schemas in Hydra's ConfigStore and must run before composing
(tritonllm.run does it on import).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore

from tritonllm.config import CacheConfig, KernelConfig, ModelConfig, ParallelConfig, SchedulerConfig
from tritonllm.metrics.logger import LOGGER_TYPES
from tritonllm.workload_config import WORKLOAD_TYPES


@dataclass
class RunConfig:
    """The top level of configs/config.yaml: the groups (typed by their own schemas) and the
    engine switches that sit outside them."""

    model: Any = None
    cache: Any = None
    scheduler: Any = None
    kernels: Any = None
    parallel: Any = None
    workload: Any = None
    logger: Any = None
    enforce_eager: bool = False  # true: no CUDA/HIP graphs at all, decode or piecewise (ablation)
    piecewise_graphs: bool = True  # false: prefill and mixed steps run eagerly (ablation)
    piecewise_first_size: int = 128  # piecewise graphs at multiples of it up to 8 x it, then 4 a doubling
    piecewise_rope_kv_write: bool = False  # true: the fused RoPE + KV write inside the piecewise graphs (opt-in)
    pdl: bool = True  # false: no programmatic dependent launch (ablation; NVIDIA sm90+ only)
    gc_freeze: bool = True  # false: the start-up heap stays in Python's cyclic GC (ablation)
    fuse_rope_kv_write: bool = True  # false: RoPE and the KV-cache write as two kernels (ablation)
    fold_rope_into_attention: bool = False  # true: split-KV decode applies RoPE, writes the step's K/V (opt-in)
    decode_group_quant: bool = True  # FP8 o_proj / down inputs per 128-column group at decode; false: per token
    fuse_attention_epilogue: bool = True  # false: split-KV merge and o_proj's input quantization as kernels (ablation)
    fuse_gated_activation: bool = False  # true: gate_up's SiLU-mul in the skinny GEMM's epilogue (ablation)
    fuse_down_input_quant: bool = False  # true: a W8A8 down projection's GEMM quantizes its input at decode sizes
    fuse_norm_into_gemm: bool = False  # true: FP8 decode GEMMs normalize their input / add the residual themselves
    fuse_moe_router: bool = True  # a MoE router's GEMM and routing in one kernel at decode sizes; false: ablation
    fuse_norm_into_router: bool = False  # true: the add + RMSNorm before a MoE block in its router's launch (opt-in)
    prefetch_weights: bool = True  # batch-1 decode steps stream weights into L2 ahead of their GEMVs; false: ablation
    output_json: str | None = None  # a path: also write the results there as JSON


def register_schemas() -> None:
    store = ConfigStore.instance()
    store.store(name="schema", node=RunConfig)
    for group, node in (("model", ModelConfig), ("cache", CacheConfig), ("scheduler", SchedulerConfig),
                        ("kernels", KernelConfig), ("parallel", ParallelConfig)):  # fmt: skip
        store.store(group=group, name="schema", node=node)
    for kind, node in WORKLOAD_TYPES.items():
        store.store(group="workload", name=f"schema_{kind}", node=node)
    for kind, node in LOGGER_TYPES.items():
        store.store(group="logger", name=f"schema_{kind}", node=node)
