"""python -m tritonllm.run [+experiment=NAME] [group=option] [key=value]: run a workload, report figures.

With no model given it runs the tiny built-in Llama, so it works on any machine.
"""

from __future__ import annotations

import json
import logging
import os
import platform as host_platform
from dataclasses import asdict
from pathlib import Path

import hydra
import torch
import triton
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from tritonllm import platform
from tritonllm.config import EngineConfig
from tritonllm.config_store import register_schemas
from tritonllm.entrypoints.llm import LLM
from tritonllm.kernels.launch import pdl_on
from tritonllm.metrics.logger import make_logger
from tritonllm.workload_config import parse_workload
from tritonllm.workloads import run_kernel_bench, run_workload

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "configs")
register_schemas()  # every group typed by its dataclass (config_store.py), before Hydra composes


def environment() -> dict[str, str]:
    device = torch.cuda.get_device_name() if platform.is_gpu() else host_platform.processor() or "cpu"
    return {
        "platform": platform.PLATFORM,
        "device": device,
        "torch": torch.__version__,
        "triton": triton.__version__,
    }


@hydra.main(version_base=None, config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    engine_cfg = EngineConfig.from_dict(
        {
            "model": OmegaConf.to_container(cfg.model),
            "cache": OmegaConf.to_container(cfg.cache),
            "scheduler": OmegaConf.to_container(cfg.scheduler),
            "kernels": OmegaConf.to_container(cfg.kernels),
            "parallel": OmegaConf.to_container(cfg.parallel),
            "enforce_eager": cfg.enforce_eager,
            "piecewise_graphs": cfg.piecewise_graphs,
            "piecewise_first_size": cfg.piecewise_first_size,
            "piecewise_rope_kv_write": cfg.piecewise_rope_kv_write,
            "pdl": cfg.pdl,
            "gc_freeze": cfg.gc_freeze,
            "fuse_rope_kv_write": cfg.fuse_rope_kv_write,
            "fold_rope_into_attention": cfg.fold_rope_into_attention,
            "fuse_attention_epilogue": cfg.fuse_attention_epilogue,
            "decode_group_quant": cfg.decode_group_quant,
            "fuse_gated_activation": cfg.fuse_gated_activation,
            "fuse_down_input_quant": cfg.fuse_down_input_quant,
            "fuse_norm_into_gemm": cfg.fuse_norm_into_gemm,
            "fuse_moe_router": cfg.fuse_moe_router,
            "fuse_norm_into_router": cfg.fuse_norm_into_router,
            "prefetch_weights": cfg.prefetch_weights,
        }
    )
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    # a sweep's runs share its folder's name as their W&B group
    group = Path(hydra_cfg.sweep.dir).name if hydra_cfg.mode == RunMode.MULTIRUN else None
    config = OmegaConf.to_container(cfg, resolve=True)
    logger = make_logger(OmegaConf.to_container(cfg.logger), run_dir, group)
    logger.start(config)
    results, requests, llm = run_job(OmegaConf.to_container(cfg.workload), engine_cfg, run_dir)
    record = json.dumps({"config": config, "results": results}, indent=2)
    (run_dir / "results.json").write_text(record)  # every run's, in Hydra's output folder
    if cfg.output_json:
        Path(cfg.output_json).write_text(record)
    logger.log_steps(step_records(llm) if llm is not None else [])
    logger.log_requests(requests)
    logger.finish(results)


def run_job(workload: dict, engine_cfg: EngineConfig, run_dir: Path) -> tuple[dict, list[dict], LLM | None]:
    """Run the workload, print its figures; returns (results, per-request table, the engine or None)."""
    if workload.get("kind") == "kernel_bench":  # no engine: the benchmarks need the GPU to themselves
        results = {**run_kernel_bench(workload, run_dir), **environment()}
        print(json.dumps(results, indent=2))
        return results, [], None
    parsed = parse_workload(workload)  # a wrong key or value fails before the engine starts
    llm = LLM.from_config(engine_cfg)
    if parsed.kind == "serve":  # until the server stops
        from tritonllm.entrypoints.cli import DEFAULT_SERVED_NAME, serve_llm

        name = parsed.served_model_name or engine_cfg.model.path or DEFAULT_SERVED_NAME
        serve_llm(llm, name, parsed.host, parsed.port, parsed.log_level)
        return {"served_model_name": name, "host": parsed.host, "port": parsed.port}, [], llm
    results = run_workload(llm, workload)
    requests = results.pop("requests", [])
    results = {**results, "model": llm.llm_engine.model_path, "kernels": llm.llm_engine.kernels.choice,
               "engine": effective_settings(llm), **environment()}  # fmt: skip
    print(json.dumps(results, indent=2))
    print(
        f"{results['num_requests']} requests: {results['output_tokens']} output tokens in {results['elapsed_s']:.2f} s"
        f" = {results['output_tok_per_s']:.1f} output tok/s"
    )
    return results, requests, llm


def effective_settings(llm: LLM) -> dict:
    """What the engine runs with where it may differ from the config (a budget raised to fit whole
    prompts without chunked prefill, graphs off for a kernel that cannot be captured)."""
    engine = llm.llm_engine
    return {
        "max_num_batched_tokens": engine.config.scheduler.max_num_batched_tokens,
        "decode_graphs": engine.runner.decode_graphs is not None,
        "piecewise_graphs": engine.runner.piecewise_graphs is not None,
        "pdl": pdl_on(),
        "kv_cache_tokens": engine.kv_cache.num_blocks * engine.kv_cache.block_size,
    }


def step_records(llm: LLM) -> list[dict]:
    """The engine's per-step series (the last 10,000 steps, warm-ups included): step time (to the
    next step's scheduling), batch size, scheduled tokens, KV usage, running and waiting."""
    steps = list(llm.llm_engine.stats.steps)
    records = []
    for i, step in enumerate(steps):
        record = {"step": i, **asdict(step)}
        record["step_ms"] = round(1000 * (steps[i + 1].time_s - step.time_s), 3) if i + 1 < len(steps) else None
        records.append(record)
    return records


if __name__ == "__main__":
    main()
