"""`python -m tritonllm.run` (Hydra): the main job runs on the tiny model and reports figures."""

import json
import os
import subprocess
import sys


def run_main(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tritonllm.run", f"hydra.run.dir={tmp_path}", *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)


def test_main_job_prints_prompts_text_and_throughput(tmp_path):
    out_json = tmp_path / "result.json"
    proc = run_main(tmp_path, "workload.max_tokens=3", f"output_json={out_json}")
    assert proc.returncode == 0, proc.stderr
    assert "Prompt: 'The quick brown fox'" in proc.stdout and "Generated:" in proc.stdout
    assert "output tok/s" in proc.stdout
    results = json.loads(out_json.read_text())["results"]
    assert results["num_requests"] == 4 and results["output_tokens"] > 0


def test_experiment_and_ablation_switches_compose(tmp_path):
    proc = run_main(
        tmp_path,
        "+experiment=prefix_sharing",
        "workload.num_requests=3",
        "workload.prefix_len=20",
        "workload.suffix_len=3",
        "workload.output_len=2",
        "kernels=torch_ref",
        "kernels.attention=triton_unified",  # one op overridden on top of the group
        "scheduler.max_num_batched_tokens=16",
        "cache.enable_prefix_caching=false",
    )
    assert proc.returncode == 0, proc.stderr
    assert '"prefix_cache_hit_rate": 0.0' in proc.stdout


def test_unknown_option_is_refused_by_name(tmp_path):
    proc = run_main(tmp_path, "+scheduler.max_num_sequences=4")
    assert proc.returncode != 0 and "max_num_sequences" in proc.stderr


def test_an_unregistered_kernel_is_refused_naming_the_registered_ones(tmp_path):
    proc = run_main(tmp_path, "kernels.rms_norm=fast9")
    assert proc.returncode != 0
    assert "kernels.rms_norm='fast9' is not registered; available: ['auto', 'triton', 'torch_ref']" in proc.stderr


def test_nanovllm_benchmark_experiment_runs_with_its_settings(tmp_path):
    out_json = tmp_path / "result.json"
    proc = run_main(
        tmp_path,
        "+experiment=nanovllm_bench",
        "model.max_model_len=128",
        "workload.num_requests=3",
        "workload.prompt_len_min=4",
        "workload.prompt_len_max=12",
        "workload.output_len_min=2",
        "workload.output_len_max=5",
        "workload.passes=1",
        "scheduler.async_scheduling=true",
        f"output_json={out_json}",
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out_json.read_text())["results"]
    assert results["temperature"] == 0.6 and results["detokenize"] is True
    assert "ttft_p99_ms" in results and "tpot_p50_ms" in results and results["peak_memory_gib"] > 0


def test_a_wandb_sweep_writes_one_offline_run_and_one_results_json_per_point(tmp_path):
    """A 2x2 Hydra sweep with logger=wandb (offline: no network or account): four W&B runs, grouped
    by the sweep's folder name, each with its per-step series, request table and figures, and four
    results.json files."""
    sweep = tmp_path / "sweep_2x2"
    cmd = [sys.executable, "-m", "tritonllm.run", "-m", f"hydra.sweep.dir={sweep}", "workload.max_tokens=2",
           "scheduler.max_num_batched_tokens=16,32", "cache.block_size=8,16", "logger=wandb"]  # fmt: skip
    env = dict(os.environ, WANDB_SILENT="true")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted(sweep.glob("*/results.json"))
    assert len(results) == 4
    points = {(r["config"]["scheduler"]["max_num_batched_tokens"], r["config"]["cache"]["block_size"])
              for r in (json.loads(p.read_text()) for p in results)}  # fmt: skip
    assert points == {(16, 8), (16, 16), (32, 8), (32, 16)}
    runs = sorted(sweep.glob("*/wandb/offline-run-*/run-*.wandb"))
    assert len(runs) == 4
    for run in runs:
        data = run.read_bytes()
        for expected in (b"sweep_2x2", b"step/step_ms", b"step/kv_cache_usage", b"requests", b"output_tok_per_s"):
            assert expected in data, (run, expected)


def test_jsonl_logger_writes_config_steps_requests_and_results(tmp_path):
    proc = run_main(tmp_path, "workload.max_tokens=3", "logger=jsonl")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "config" and kinds[-1] == "results"
    steps = [r for r in records if r["kind"] == "step"]
    assert steps and {"step_ms", "num_scheduled_seqs", "num_scheduled_tokens", "kv_cache_usage"} <= set(steps[0])
    requests = [r for r in records if r["kind"] == "request"]
    assert len(requests) == 4 and all(r["output_tokens"] == 3 and r["ttft_ms"] > 0 for r in requests)
    assert json.loads((tmp_path / "results.json").read_text())["results"]["num_requests"] == 4
