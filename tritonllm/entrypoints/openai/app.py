"""The FastAPI app: OpenAI routes over one AsyncLLMEngine, OpenAI-style errors, /health, /metrics.

Bad input is always an HTTP 400 with `{"error": {"message", "type", "code"}}` whose message names
the fix; the engine thread never sees it, so the server keeps serving the other requests.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from tritonllm.engine.async_engine import AsyncLLMEngine, EngineDeadError
from tritonllm.entrypoints.openai.metrics import CONTENT_TYPE, prometheus_text
from tritonllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from tritonllm.entrypoints.openai.serving import BadRequestError, error_response
from tritonllm.entrypoints.openai.serving_chat import OpenAIServingChat
from tritonllm.entrypoints.openai.serving_completion import OpenAIServingCompletion

logger = logging.getLogger(__name__)


def _error(message: str, status_code: int, kind: str) -> JSONResponse:
    return JSONResponse(error_response(message, status_code, kind).model_dump(), status_code=status_code)


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


def build_app(engine: AsyncLLMEngine, served_model_name: str) -> FastAPI:
    """The server's routes over `engine`. The app does not own the engine: whoever built it shuts it down."""
    app = FastAPI(title="tritonllm OpenAI-compatible server")
    completions = OpenAIServingCompletion(engine, served_model_name)
    chat = OpenAIServingChat(engine, served_model_name)

    @app.exception_handler(BadRequestError)
    async def bad_request(_: Request, exc: BadRequestError) -> JSONResponse:
        return _error(str(exc), 400, "BadRequestError")

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(_validation_message(exc), 400, "BadRequestError")

    @app.exception_handler(EngineDeadError)
    async def engine_dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return _error(str(exc), 503, "ServiceUnavailableError")

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("request failed")
        return _error(f"internal error: {exc}", 500, "InternalServerError")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.is_running else 503)

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

    return app
