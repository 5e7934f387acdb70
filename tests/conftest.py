import os

import pytest
import torch
from interpreter_speedup import install as _install_interpreter_speedup

from tritonllm.models.tiny import TINY_ARCHITECTURES, tiny_model_path

_install_interpreter_speedup()

if os.environ.get("PYTEST_XDIST_WORKER"):  # one process per core already: torch threads would oversubscribe
    torch.set_num_threads(1)


@pytest.fixture(scope="session", params=TINY_ARCHITECTURES)
def tiny_model(request) -> str:
    """The path of a tiny random-weight HF folder, once per supported architecture."""
    return str(tiny_model_path(request.param))


@pytest.fixture(scope="session")
def tiny_llama() -> str:
    return str(tiny_model_path("LlamaForCausalLM"))
