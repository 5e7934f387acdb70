"""The shipped experiment configs: every one composes, every ablation sweeps keys that exist, an
ablation sweep runs end to end on the tiny model, and typed workloads refuse wrong keys and values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tritonllm.run import CONFIG_DIR
from tritonllm.workload_config import RandomWorkload, parse_workload

EXPERIMENTS = sorted(p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))
REQUIRED = {"generate", "throughput", "kernel_bench", "serve", "ablate_chunked_prefill", "ablate_prefix_caching",
            "ablate_cuda_graphs", "ablate_overlap", "ablate_block_size", "ablate_kv_cache_dtype", "ablate_attention",
            "ablate_policy"}  # fmt: skip


def test_the_required_experiments_ship() -> None:
    assert REQUIRED <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_sweeps_existing_keys(name: str) -> None:
    with initialize_config_dir(config_dir=str(Path(CONFIG_DIR).resolve()), version_base=None):
        cfg = compose("config", overrides=[f"+experiment={name}"], return_hydra_config=True)
    parse_workload(OmegaConf.to_container(cfg.workload))
    for key, values in (cfg.hydra.sweeper.params or {}).items():
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        assert node is not None and leaf in node, f"{name} sweeps {key}, which the config does not have"
        assert "," in str(values), (key, values)


def test_an_ablation_sweep_runs_every_point(tmp_path) -> None:
    sweep = tmp_path / "policy"
    cmd = [sys.executable, "-m", "tritonllm.run", "-m", "+experiment=ablate_policy", f"hydra.sweep.dir={sweep}",
           "workload.num_requests=3", "workload.prompt_len_min=4", "workload.prompt_len_max=9",
           "workload.output_len_min=2", "workload.output_len_max=3", "workload.warmup_requests=0"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/results.json"))]
    assert sorted(r["config"]["scheduler"]["policy"] for r in runs) == ["fcfs", "priority"]
    assert all(r["results"]["num_requests"] == 3 for r in runs)
    assert all("priority0_ttft_mean_ms" in r["results"] or "priority1_ttft_mean_ms" in r["results"] for r in runs)


def test_typed_workloads_refuse_wrong_keys_and_values() -> None:
    assert parse_workload({"kind": "random", "num_requests": 5, "temperature": 1}) == RandomWorkload(
        kind="random", num_requests=5, temperature=1
    )
    with pytest.raises(ValueError, match=r"unknown workload option\(s\) \['num_request'\]"):
        parse_workload({"kind": "random", "num_request": 5})
    with pytest.raises(ValueError, match="workload.num_requests='many' is not a int"):
        parse_workload({"kind": "random", "num_requests": "many"})
    with pytest.raises(ValueError, match="workload.kind='batch' is not one of"):
        parse_workload({"kind": "batch"})


def test_the_serve_experiment_serves_the_configured_engine(tiny_llama, monkeypatch, tmp_path) -> None:
    from fastapi.testclient import TestClient

    from tritonllm.config import EngineConfig, ModelConfig
    from tritonllm.entrypoints import cli
    from tritonllm.run import run_job

    started = {}
    monkeypatch.setattr(cli, "run_server", lambda app, host, port, **kw: started.update(app=app, port=port))
    engine_cfg = EngineConfig(model=ModelConfig(path=tiny_llama, max_model_len=64))
    workload = {"kind": "serve", "port": 9003, "served_model_name": "tiny"}
    results, requests, _ = run_job(workload, engine_cfg, tmp_path)
    assert started["port"] == 9003 and results["served_model_name"] == "tiny" and requests == []
    models = TestClient(started["app"]).get("/v1/models").json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [("tiny", 64)]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["+experiment=throughput", "workload.num_requests=many"],
            "Value 'many' of type 'str' could not be converted to Integer",
        ),
        (["+experiment=throughput", "workload.num_request=5"], "Key 'num_request' not in 'RandomWorkload'"),
        (["cache.block_size=big"], "could not be converted to Integer"),
        (["enforce_eager=maybe"], "Value 'maybe' is not a valid bool"),
        (["logger=wandb", "logger.mod=online"], "Key 'mod' not in 'WandbLoggerConfig'"),
    ],
)
def test_hydra_refuses_a_wrong_key_or_value_while_composing(overrides, message) -> None:
    with initialize_config_dir(config_dir=str(Path(CONFIG_DIR).resolve()), version_base=None):
        with pytest.raises(Exception) as error:
            compose("config", overrides=overrides)
    assert message in f"{error.value} {error.value.__cause__}"  # Hydra's message and its detail
