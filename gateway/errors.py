"""Typed errors of the request path and their OpenAI-style JSON bodies.

Retryability is decided where a failure is understood (the upstream client) and carried on the
error as data, so the retry policy never has to guess from exception types.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from gateway.outcomes import Failure


class GatewayError(Exception):
    """An error answered to the client as `{"error": {...}}` with an HTTP status."""

    status = 500
    type = "server_error"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param

    def body(self) -> bytes:
        return error_body(self.message, self.type, code=self.code, param=self.param)

    def headers(self) -> dict[str, str]:
        return {}

    def response(self) -> web.Response:
        return web.Response(
            status=self.status,
            body=self.body(),
            content_type="application/json",
            headers=self.headers(),
        )


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"

    def __init__(
        self, message: str, *, status: int = 400, code: str | None = None, param: str | None = None
    ):
        super().__init__(message, code=code, param=param)
        self.status = status


class Overloaded(GatewayError):
    """Typed overload: 429 when units are full (saturated), 503 when none is routable."""

    def __init__(self, message: str, *, status: int, code: str, retry_after: int) -> None:
        super().__init__(message, code=code)
        self.status = status
        self.type = "rate_limit_error" if status == 429 else "service_unavailable"
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class UpstreamError(GatewayError):
    """A unit failed before the answer's first byte reached the client; `kind` says how."""

    type = "upstream_error"

    def __init__(
        self,
        unit_id: str,
        kind: Failure,
        detail: str,
        *,
        retryable: bool,
        status: int | None = None,
    ):
        super().__init__(f"unit {unit_id} failed ({kind}): {detail}", code=kind)
        self.unit_id = unit_id
        self.kind = kind
        self.retryable = retryable
        self.upstream_status = status
        # LOCAL: the gateway's own limits (open files, upstream connections) ran out, not the
        # unit: the service, not the upstream, is what is unavailable.
        self.status = 504 if kind.timeout else 503 if kind is Failure.LOCAL else 502


def error_body(
    message: str, type_: str, *, code: str | None = None, param: str | None = None
) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )
