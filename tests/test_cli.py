"""`tritonllm serve`: every LLM argument is a kebab-case flag, and the flags become LLM's kwargs."""

import inspect
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from tritonllm import LLM
from tritonllm.entrypoints import cli
from tritonllm.entrypoints.cli import build_parser, llm_kwargs, main

LLM_ARGS = [name for name in inspect.signature(LLM.__init__).parameters if name not in ("self", "model")]


def test_help_lists_every_llm_argument_as_a_kebab_case_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for name in LLM_ARGS:
        assert "--" + name.replace("_", "-") in text
    for flag in (
        "--host",
        "--port",
        "--served-model-name",
        "--no-enable-prefix-caching",
        "--no-enable-chunked-prefill",
    ):
        assert flag in text


def test_no_flags_give_llm_defaults_and_the_tiny_model():
    kwargs = llm_kwargs(build_parser().parse_args(["serve"]))
    defaults = {name: p.default for name, p in inspect.signature(LLM.__init__).parameters.items() if name != "self"}
    assert kwargs == defaults
    assert kwargs["model"] is None  # LLM's tiny built-in Llama


def test_flags_map_to_llm_kwargs():
    args = build_parser().parse_args(
        [
            "serve",
            "/models/llama",
            "--port",
            "9001",
            "--dtype",
            "float16",
            "--max-model-len",
            "4096",
            "--gpu-memory-utilization",
            "0.8",
            "--block-size",
            "32",
            "--max-num-seqs",
            "64",
            "--max-num-batched-tokens",
            "2048",
            "--no-enable-prefix-caching",
            "--no-enable-chunked-prefill",
            "--enforce-eager",
            "--no-piecewise-graphs",
            "--no-piecewise-rope-kv-write",
            "--no-pdl",
            "--no-gc-freeze",
            "--no-fuse-rope-kv-write",
            "--fold-rope-into-attention",
            "--no-fuse-attention-epilogue",
            "--fuse-gated-activation",
            "--kv-cache-dtype",
            "fp8",
            "--calculate-kv-scales",
            "--quantization",
            "int8",
            "--load-format",
            "dummy",
            "--seed",
            "3",
            "--num-gpu-blocks-override",
            "100",
            "--scheduling-policy",
            "priority",
            "--kernel-backend",
            "torch_ref",
            "--tokenizer",
            "/models/tok",
            "--no-async-scheduling",
            "--kernels",
            "attention=torch_ref,rms_norm=triton",
            "--tensor-parallel-size",
            "4",
            "--distributed-launcher",
            "torchrun",
            "--piecewise-first-size",
            "64",
            "--no-align-prefill-chunks",
            "--fuse-down-input-quant",
            "--no-decode-group-quant",
            "--fuse-norm-into-gemm",
            "--no-fuse-moe-router",
            "--fuse-norm-into-router",
            "--no-prefetch-weights",
        ]
    )
    assert args.port == 9001
    assert llm_kwargs(args) == {
        "model": "/models/llama",
        "tokenizer": "/models/tok",
        "dtype": "float16",
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.8,
        "block_size": 32,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 2048,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": False,
        "enforce_eager": True,
        "piecewise_graphs": False,
        "piecewise_first_size": 64,
        "piecewise_rope_kv_write": False,
        "pdl": False,
        "gc_freeze": False,
        "fuse_rope_kv_write": False,
        "fold_rope_into_attention": True,
        "fuse_attention_epilogue": False,
        "decode_group_quant": False,
        "fuse_gated_activation": True,
        "fuse_down_input_quant": True,
        "fuse_norm_into_gemm": True,
        "fuse_moe_router": False,
        "fuse_norm_into_router": True,
        "prefetch_weights": False,
        "quantization": "int8",
        "load_format": "dummy",
        "kv_cache_dtype": "fp8",
        "calculate_kv_scales": True,
        "seed": 3,
        "num_gpu_blocks_override": 100,
        "scheduling_policy": "priority",
        "align_prefill_chunks": False,
        "kernel_backend": "torch_ref",
        "async_scheduling": False,
        "kernels": {"attention": "torch_ref", "rms_norm": "triton"},
        "tensor_parallel_size": 4,
        "distributed_launcher": "torchrun",
    }


def test_a_bad_flag_value_exits_with_the_engine_message(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--block-size", "3"])
    assert exit_info.value.code == 2
    assert "block_size=3 must be a power of two" in capsys.readouterr().err


def test_serve_builds_the_app_from_the_flags(tiny_llama, monkeypatch, caplog):
    started = {}
    monkeypatch.setattr(cli, "run_server", lambda app, host, port, **kw: started.update(app=app, port=port, **kw))
    main(["serve", tiny_llama, "--port", "9002", "--max-model-len", "64", "--served-model-name", "tiny",
          "--api-key", "sesame", "--max-n", "3", "--shutdown-timeout", "5"])  # fmt: skip
    assert started["port"] == 9002 and started["timeout_graceful_shutdown"] == 5
    client = TestClient(started["app"])
    assert client.get("/v1/models").status_code == 401
    auth = {"Authorization": "Bearer sesame"}
    models = client.get("/v1/models", headers=auth).json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [("tiny", 64)]
    r = client.post("/v1/completions", json={"prompt": "hi", "n": 4}, headers=auth)
    assert r.status_code == 400 and "limit of 3" in r.json()["error"]["message"]
    assert "without an API key" not in caplog.text  # a key is set: no warning for 0.0.0.0


def test_serving_all_interfaces_without_a_key_warns(tiny_llama, monkeypatch, caplog):
    monkeypatch.setattr(cli, "run_server", lambda app, host, port, **kw: None)
    monkeypatch.delenv("TRITONLLM_API_KEY", raising=False)
    main(["serve", tiny_llama, "--max-model-len", "64"])
    assert "serving on 0.0.0.0 without an API key" in caplog.text


def test_python_dash_m_runs_the_cli():
    result = subprocess.run(
        [sys.executable, "-m", "tritonllm.entrypoints.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "--max-model-len" in result.stdout
