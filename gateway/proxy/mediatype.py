"""A request body's content type: JSON only, the rest refused as vLLM refuses it.

vLLM's OpenAI server serves its routes only to a `Content-Type` whose media type, lowercased
and cut at the first `;`, is exactly `application/json` (a missing header too is refused), and
answers anything else 400 with the body of its request-validation errors. The gateway, which
sends every unit JSON, would otherwise serve a form-encoded body that vLLM itself refuses: it
refuses it first, with vLLM's own status and body, on either front.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from gateway.errors import InvalidRequest

JSON = "application/json"
# vLLM's message for it: FastAPI's rendering of its one validation error.
MESSAGE = "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"


class NotJson(InvalidRequest):
    """400 with vLLM's body, `{"error": {...}}` in its shape: type "Bad Request", code 400."""

    def __init__(self) -> None:
        super().__init__(MESSAGE)

    def body(self, request_id: str | None = None) -> bytes:
        error = {"message": MESSAGE, "type": "Bad Request", "param": None, "code": 400}
        return orjson.dumps({"error": error})


def require_json(headers: Mapping[str, str]) -> None:
    """NotJson unless the request says its body is JSON, as vLLM reads the header."""
    media = headers.get("Content-Type", "").lower().split(";", 1)[0]
    if media != JSON:
        raise NotJson()
