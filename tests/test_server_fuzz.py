"""Schemathesis fuzzes every route of the server's OpenAPI schema (valid and invalid bodies, odd
types, huge numbers, unicode): no answer may be a 5xx, and the server keeps serving afterwards with
no request left in the engine."""

import asyncio

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tritonllm import LLM
from tritonllm.engine.async_engine import AsyncLLMEngine
from tritonllm.entrypoints.openai.app import build_app
from tritonllm.entrypoints.openai.limits import ServerLimits

# the server's behaviour, not its kernels, is under test: the torch reference kernels run natively on
# the CPU (the Triton ones in the interpreter: ~30x slower at 200 concurrent requests)
REF = "torch_ref"


@pytest.fixture(scope="module")
def fuzz_engine(tiny_llama):
    engine = AsyncLLMEngine(LLM(model=tiny_llama, max_model_len=64, seed=0, kernel_backend=REF).llm_engine)
    yield engine
    engine.shutdown()


def test_no_route_answers_5xx(fuzz_engine):
    app = build_app(fuzz_engine, "tiny", ServerLimits(max_n=4, request_timeout_s=20))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(case) -> None:
            response = case.call()
            case.validate_response(response, checks=[not_a_server_error])

        fuzz()

    def idle(e) -> bool:
        return not e.has_unfinished_requests() and e.kv_cache.num_free_blocks == e.kv_cache.num_blocks

    assert fuzz_engine.is_running and asyncio.run(fuzz_engine.call(idle))
