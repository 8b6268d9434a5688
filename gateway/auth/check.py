"""Who a request is from: its `Authorization: Bearer <key>` header looked up in the key table.

`[auth] required = false`: a valid key names its tenant, and anything else (no header, a
dummy key such as the OpenAI SDK's users send to servers that need none, a revoked or expired
key) is served as ANONYMOUS. `required = true`: anything else is refused with 401 in the
OpenAI API's shape (`invalid_api_key`). A message never echoes the key a client sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.auth.caller import ANONYMOUS, Caller
from gateway.auth.keys import digest
from gateway.auth.ring import KeyRing
from gateway.config.auth import AuthConfig
from gateway.errors import InvalidRequest

HOW = "send `Authorization: Bearer <key>`"


class Unauthorized(InvalidRequest):
    def __init__(self, message: str) -> None:
        super().__init__(message, status=401, code="invalid_api_key")

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


def identify(header: str | None, ring: KeyRing, now: float) -> Caller | str:
    """The caller, or why the header names none (a message for the client)."""
    if header is None or not header.strip():
        return f"Missing API key: {HOW}"
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return f"Malformed Authorization header: {HOW}"
    key = ring.by_hash.get(digest(token))
    if key is None:
        return "Incorrect API key provided"
    if key.revoked is not None:
        return f"The API key {key.prefix} has been revoked"
    if not key.valid(now):
        return f"The API key {key.prefix} has expired"
    return key.caller()


class Gatekeeper:
    """The request path's check: a Caller, or Unauthorized when a key is required."""

    def __init__(
        self, config: AuthConfig, ring: KeyRing, clock: Callable[[], float] = time.time
    ) -> None:
        self.required = config.required
        self.ring = ring
        self._clock = clock

    def caller(self, header: str | None) -> Caller:
        if not self.required and not self.ring.by_hash:
            return ANONYMOUS  # no keys at all: nothing to look up
        found = identify(header, self.ring, self._clock())
        if isinstance(found, Caller):
            return found
        if self.required:
            raise Unauthorized(found)
        return ANONYMOUS
