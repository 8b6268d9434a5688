"""OpenAI-style errors: one exception type that renders as a JSON response or an SSE event.

Every refusal carries the offending parameter's name, so a client (or the gateway's logs) can
see which field to fix without parsing the message.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from engine.api import TokenOutOfVocab
from engine.scheduler import EmptyPrompt, FieldError, PromptTooLong

JSON = dict[str, Any]


class ApiError(Exception):
    """Raised anywhere below a handler; the handler turns it into the wire form that still fits."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @property
    def type(self) -> str:
        if self.status == 503:
            return "service_unavailable"
        return "server_error" if self.status >= 500 else "invalid_request_error"

    def payload(self) -> JSON:
        error = {"message": self.message, "type": self.type, "param": self.param}
        return {"error": {**error, "code": self.code}}

    def response(self) -> web.Response:
        return json_response(self.payload(), self.status)


def bad(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def engine_failed(message: str) -> ApiError:
    """The unit cannot answer (a follower died, the engine stopped): retryable elsewhere."""
    return ApiError(503, message, code="engine_error")


def refused(exc: ValueError, prompt_param: str) -> ApiError:
    """The engine's typed refusals, mapped to the request field that caused them."""
    if isinstance(exc, PromptTooLong):
        message = f"The prompt has {exc.prompt_len} tokens; at most {exc.limit} fit this model"
        return bad(message, prompt_param, "context_length_exceeded")
    if isinstance(exc, EmptyPrompt):
        return bad(f"'{prompt_param}' must not be empty", prompt_param)
    if isinstance(exc, TokenOutOfVocab):
        return bad(f"'{prompt_param}': {exc}", prompt_param)
    if isinstance(exc, FieldError):
        return bad(f"'{exc.field}' {exc.problem}, got {exc.value!r}", exc.field)
    return bad(str(exc), None)


def json_response(body: object, status: int = 200) -> web.Response:
    data = orjson.dumps(body, default=str)
    return web.Response(body=data, status=status, content_type="application/json")
