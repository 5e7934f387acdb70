"""The FastAPI app: OpenAI routes over one AsyncLLMEngine, OpenAI-style errors, /health, /metrics,
/version, /tokenize, /detokenize.

Bad input is always an HTTP 4xx with `{"error": {"message", "type", "code"}}` whose message names
the fix; the engine thread never sees it, so the server keeps serving the other requests. Limits
(limits.py): /v1/* routes need the API key when one is set (401; /health, /metrics, /version,
/tokenize and /detokenize stay open, as in vLLM), bodies over the size limit are refused (413), n /
best_of / prompts per request are capped (400), beyond the waiting-request cap a request is refused
with 503 and Retry-After before it reaches the engine, and a request past the timeout is aborted
(408). An internal error is a 500 that names the request id and nothing else; the log has the rest.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

import tritonllm
from tritonllm.engine.async_engine import AsyncLLMEngine, EngineDeadError, EngineOverloadedError
from tritonllm.entrypoints.openai.limits import ServerLimits
from tritonllm.entrypoints.openai.metrics import CONTENT_TYPE, prometheus_text
from tritonllm.entrypoints.openai.middleware import ServerMiddleware
from tritonllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from tritonllm.entrypoints.openai.serving import BadRequestError, RequestTimeoutError, error_response
from tritonllm.entrypoints.openai.serving_chat import OpenAIServingChat
from tritonllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from tritonllm.entrypoints.openai.serving_tokenize import DetokenizeRequest, OpenAIServingTokenization, TokenizeRequest


def _error(message: str, status_code: int, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = error_response(message, status_code, kind).model_dump()
    return JSONResponse(body, status_code=status_code, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    problems = []
    for err in exc.errors():
        field = ".".join(str(part) for part in err.get("loc", ())[1:]) or "body"
        problems.append(f"{field}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(problems)


def _respond(result: BaseModel | object) -> Response:
    if isinstance(result, BaseModel):
        return JSONResponse(result.model_dump())
    return StreamingResponse(result, media_type="text/event-stream")


def build_app(engine: AsyncLLMEngine, served_model_name: str, limits: ServerLimits | None = None) -> FastAPI:
    """The server's routes over `engine`. The app does not own the engine: whoever built it shuts it
    down. The waiting-request cap of `limits` is applied to the engine."""
    limits = limits or ServerLimits()
    engine.max_waiting_requests = limits.max_waiting_requests
    app = FastAPI(title="tritonllm OpenAI-compatible server", version=tritonllm.__version__)
    app.add_middleware(ServerMiddleware, api_key=limits.api_key, max_body_bytes=limits.max_request_body_bytes)
    completions = OpenAIServingCompletion(engine, served_model_name, limits)
    chat = OpenAIServingChat(engine, served_model_name, limits)
    tokenization = OpenAIServingTokenization(engine, served_model_name, limits)

    @app.exception_handler(BadRequestError)
    async def bad_request(_: Request, exc: BadRequestError) -> JSONResponse:
        return _error(str(exc), 400, "BadRequestError")

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(_validation_message(exc), 400, "BadRequestError")

    @app.exception_handler(EngineDeadError)
    async def engine_dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return _error(str(exc), 503, "ServiceUnavailableError")

    @app.exception_handler(EngineOverloadedError)
    async def overloaded(_: Request, exc: EngineOverloadedError) -> JSONResponse:
        return _error(str(exc), 503, "ServiceUnavailableError", {"Retry-After": str(limits.retry_after_s)})

    @app.exception_handler(RequestTimeoutError)
    async def timed_out(_: Request, exc: RequestTimeoutError) -> JSONResponse:
        return _error(str(exc), 408, "TimeoutError")

    @app.get("/health")
    async def health() -> Response:
        """200; 503 when the engine thread has stopped or its steps keep failing (degraded)."""
        if engine.is_healthy:
            return Response(status_code=200)
        return Response("degraded" if engine.is_running else "engine stopped", status_code=503)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = ModelCard(id=served_model_name, root=engine.engine.model_path, max_model_len=engine.engine.max_model_len)
        return JSONResponse(ModelList(data=[card]).model_dump())

    @app.post("/v1/completions")
    async def create_completion(request: CompletionRequest) -> Response:
        return _respond(await completions.create(request))

    @app.post("/v1/chat/completions")
    async def create_chat_completion(request: ChatCompletionRequest) -> Response:
        return _respond(await chat.create(request))

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(prometheus_text(await engine.get_metrics(), served_model_name), media_type=CONTENT_TYPE)

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": tritonllm.__version__})

    @app.post("/tokenize")
    async def tokenize(request: TokenizeRequest) -> JSONResponse:
        return JSONResponse((await tokenization.tokenize(request)).model_dump())

    @app.post("/detokenize")
    async def detokenize(request: DetokenizeRequest) -> JSONResponse:
        return JSONResponse((await tokenization.detokenize(request)).model_dump())

    return app
