"""ASGI middleware of the OpenAI server: request ids, API-key authentication, body-size limits.

Pure ASGI (no BaseHTTPMiddleware), so streamed responses pass through untouched. Errors are
OpenAI-shaped JSON bodies: {"error": {"message", "type", "code"}}.
"""

from __future__ import annotations

import contextvars
import hmac
import json
import logging
import uuid

logger = logging.getLogger(__name__)
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
REQUEST_ID_HEADER = b"x-request-id"


def internal_error_message() -> str:
    """What a client learns of an internal failure: the request id to find it in the log, nothing else."""
    return f"internal server error (request id {REQUEST_ID.get()}): the server log has the details"


class RequestIdFilter(logging.Filter):
    """Puts the current request's id on every log record (`%(request_id)s` in the format)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


async def send_error(send, status: int, message: str, kind: str, headers: list | None = None) -> None:
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    start_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": start_headers + (headers or [])})
    await send({"type": "http.response.body", "body": body})


class ServerMiddleware:
    """Every HTTP request gets an id (the client's X-Request-Id, else a new one) in the log context and
    the response's X-Request-Id header; /v1/* routes check the API key (constant-time) when one is
    set; bodies over the limit are refused with 413 before the route reads them; an exception that
    escapes the app is logged and answered with a 500 that names the request id only."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes
        self.api_key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        request_id = headers.get(REQUEST_ID_HEADER, b"").decode("latin-1")[:128] or uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)
        id_header = [(REQUEST_ID_HEADER, request_id.encode("latin-1"))]

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message, headers=list(message.get("headers") or []) + id_header)
            await send(message)

        try:
            if self.api_key is not None and scope["path"].startswith("/v1/") and not self._authorized(headers):
                await send_error(send_with_id, 401, "a valid API key is required: send 'Authorization: Bearer <key>'",
                                 "AuthenticationError", [(b"www-authenticate", b"Bearer")])  # fmt: skip
                return
            length = headers.get(b"content-length")
            if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
                await send_error(send_with_id, 413, self._too_large(), "RequestTooLargeError")
                return
            await self._app_with_body_limit(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)

    async def _app_with_body_limit(self, scope, receive, send) -> None:
        """Run the app; a body (sent without Content-Length, or longer than it said) that grows past
        the limit gets the 413 here, the app sees a disconnect and whatever it sends is dropped."""
        seen, refused = 0, False

        async def limited_receive():
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    if not refused:
                        refused = True
                        await send_error(send, 413, self._too_large(), "RequestTooLargeError")
                    return {"type": "http.disconnect"}
            return message

        started = False

        async def guarded_send(message) -> None:
            nonlocal started
            if not refused:
                started = started or message["type"] == "http.response.start"
                await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            # here, not in an app exception handler: those run outside this middleware, after the
            # request id is gone. The client learns the id, the log gets the exception.
            if refused:
                return
            logger.exception("request failed")
            if not started:
                await send_error(send, 500, internal_error_message(), "InternalServerError")

    def _authorized(self, headers: dict) -> bool:
        scheme, _, key = headers.get(b"authorization", b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(key.strip(), self.api_key)

    def _too_large(self) -> str:
        return (
            f"the request body exceeds {self.max_body_bytes} bytes: send a smaller request (--max-request-body-bytes)"
        )
