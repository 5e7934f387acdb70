"""What one server accepts: its API key, request limits, back-pressure and timeouts
(`tritonllm serve` flags; README "OpenAI-compatible server" lists them)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

API_KEY_ENV = "TRITONLLM_API_KEY"


@dataclass(frozen=True)
class ServerLimits:
    api_key: str | None = None  # every /v1/* route needs "Authorization: Bearer <key>"; /health, /metrics stay open
    max_request_body_bytes: int = 8 << 20  # larger bodies: 413
    max_n: int = 128  # n and best_of (OpenAI's own cap is 128)
    max_prompts_per_request: int = 256  # a completions request's prompt list
    max_waiting_requests: int | None = 1024  # requests admitted but not yet generating; beyond: 503 + Retry-After
    request_timeout_s: float | None = None  # a request still running after this: aborted, 408 (or an error event)
    retry_after_s: int = 1  # the Retry-After of a 503

    def __post_init__(self) -> None:
        for name in ("max_request_body_bytes", "max_n", "max_prompts_per_request", "retry_after_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_waiting_requests is not None and self.max_waiting_requests < 1:
            raise ValueError(
                f"max_waiting_requests must be at least 1 (or None: unbounded), got {self.max_waiting_requests}"
            )
        if self.request_timeout_s is not None and self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be positive (or None), got {self.request_timeout_s}")


def api_key_from(flag: str | None) -> str | None:
    """--api-key, else $TRITONLLM_API_KEY, else None (no authentication)."""
    return flag or os.environ.get(API_KEY_ENV) or None


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: assume reachable from elsewhere
        return False
