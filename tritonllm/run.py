"""python -m tritonllm.run [+experiment=NAME] [group=option] [key=value]: run a workload, report figures.

With no model given it runs the tiny built-in Llama, so it works on any machine.
"""

from __future__ import annotations

import json
import logging
import os
import platform as host_platform

import hydra
import torch
import triton
from omegaconf import DictConfig, OmegaConf

from tritonllm import platform
from tritonllm.config import EngineConfig
from tritonllm.entrypoints.llm import LLM
from tritonllm.metrics.logger import make_logger
from tritonllm.workloads import run_workload

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "configs")


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
            "enforce_eager": cfg.enforce_eager,
            "piecewise_graphs": cfg.piecewise_graphs,
        }
    )
    llm = LLM.from_config(engine_cfg)
    results = run_workload(llm, OmegaConf.to_container(cfg.workload))
    results = {**results, "model": llm.llm_engine.model_path, **environment()}
    print(json.dumps(results, indent=2))
    print(
        f"{results['num_requests']} requests: {results['output_tokens']} output tokens in {results['elapsed_s']:.2f} s"
        f" = {results['output_tok_per_s']:.1f} output tok/s"
    )
    if cfg.output_json:
        with open(cfg.output_json, "w") as f:
            json.dump({"config": OmegaConf.to_container(cfg), "results": results}, f, indent=2)
    make_logger(OmegaConf.to_container(cfg.logger), OmegaConf.to_container(cfg)).log(results)


if __name__ == "__main__":
    main()
