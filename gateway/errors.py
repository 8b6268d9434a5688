"""Typed errors of the request path and their OpenAI-style JSON bodies.

Retryability is decided where a failure is understood (the upstream client) and carried on the
error as data, so the retry policy never has to guess from exception types.

An error has two texts: `message`, what the client is told, and `detail`, what the log says.
A unit's failure tells the client its kind and the request id only: the unit's address, the
OS's error text and the unit's own error body stay in `detail`, for the operator.
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

    @property
    def detail(self) -> str:
        """What the log says about it (by default what the client is told)."""
        return self.message

    def client_message(self, request_id: str | None = None) -> str:
        """What the client is told; a failure the operator must look into names the request."""
        return self.message

    def body(self, request_id: str | None = None) -> bytes:
        message = self.client_message(request_id)
        return error_body(message, self.type, code=self.code, param=self.param)

    def headers(self) -> dict[str, str]:
        return {}

    def response(self, request_id: str | None = None) -> web.Response:
        headers = self.headers()
        if request_id is not None:
            headers["x-request-id"] = request_id
        return web.Response(
            status=self.status,
            body=self.body(request_id),
            content_type="application/json",
            headers=headers,
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
        super().__init__(kind.message, code=kind)
        self._detail = detail
        self.at = ""  # the unit's address, when the upstream client knows it
        self.unit_id = unit_id
        self.kind = kind
        self.retryable = retryable
        self.upstream_status = status
        # LOCAL: the gateway's own limits (open files, upstream connections) ran out, not the
        # unit: the service, not the upstream, is what is unavailable.
        self.status = 504 if kind.timeout else 503 if kind is Failure.LOCAL else 502

    @property
    def detail(self) -> str:
        at = f" at {self.at}" if self.at else ""
        return f"unit {self.unit_id}{at} failed ({self.kind}): {self._detail}"

    def client_message(self, request_id: str | None = None) -> str:
        message = self.message
        if self.upstream_status is not None:
            message = f"{message} (HTTP {self.upstream_status})"
        return message if request_id is None else with_request_id(message, request_id)


def with_request_id(message: str, request_id: str) -> str:
    return f"{message} (request id {request_id})"


def error_body(
    message: str, type_: str, *, code: str | None = None, param: str | None = None
) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )
