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


@pytest.fixture(scope="session", params=TINY_ARCHITECTURES)
def tiny_model(request) -> str:
    """The path of a tiny random-weight HF folder, once per supported architecture."""
    return str(tiny_model_path(request.param))


@pytest.fixture(scope="session")
def tiny_llama() -> str:
    return str(tiny_model_path("LlamaForCausalLM"))
