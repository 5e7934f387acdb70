import os

import pytest
import torch
from interpreter_speedup import install as _install_interpreter_speedup
from interpreter_speedup import language_restorer

from tritonllm.models.tiny import TINY_ARCHITECTURES, tiny_model_path

_install_interpreter_speedup()
_restore_language = language_restorer()  # before any test has run a kernel


@pytest.fixture(autouse=True)
def _triton_language_as_imported():
    """Each test ends with triton.language as imported: the interpreter's leftover patches (interpreter_speedup)
    would break a later test's compilation for a real GPU in the same worker."""
    yield
    _restore_language()


if os.environ.get("PYTEST_XDIST_WORKER"):  # one process per core already: torch threads would oversubscribe
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _engines_share_the_gpu(monkeypatch):
    """Under xdist workers on one GPU (scripts/gpu_check.sh tests-engine with TEST_WORKERS), each engine sizes its KV
    cache from an equal share of the card (80% of it over the workers, less its profiling step's peak) instead of
    90% of what the other workers' engines have left, which the first to start would take."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and torch.cuda.is_available():
        from tritonllm.worker import setup

        def share(config, runner) -> int:
            if config.cache.num_gpu_blocks_override is not None:
                return config.cache.num_gpu_blocks_override
            total = torch.cuda.get_device_properties(runner.device).total_memory
            peak = setup.profile_peak_bytes(runner, config.scheduler)
            return max(1, int((total * 0.8 / workers - peak) // runner.kv_bytes_per_block()))

        monkeypatch.setattr(setup, "num_kv_blocks", share)
    yield


@pytest.fixture(scope="session", params=TINY_ARCHITECTURES)
def tiny_model(request) -> str:
    """The path of a tiny random-weight HF folder, once per supported architecture."""
    return str(tiny_model_path(request.param))


@pytest.fixture(scope="session")
def tiny_llama() -> str:
    return str(tiny_model_path("LlamaForCausalLM"))
