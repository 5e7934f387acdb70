"""`python -m tritonllm.run` (Hydra): the main job runs on the tiny model and reports figures."""

import json
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
