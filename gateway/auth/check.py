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
from gateway.auth.keys import Key, digest
from gateway.auth.ring import KeyRing
from gateway.config.auth import AuthConfig
from gateway.errors import InvalidRequest

HOW = "send `Authorization: Bearer <key>`"
REMEMBERED = 4096  # headers of known keys remembered at once (Gatekeeper)


class Unauthorized(InvalidRequest):
    def __init__(self, message: str) -> None:
        super().__init__(message, status=401, code="invalid_api_key")

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


def identify(header: str | None, ring: KeyRing, now: float) -> Caller | str:
    """The caller, or why the header names none (a message for the client)."""
    key = lookup(header, ring)
    return key if isinstance(key, str) else checked(key, now)


def lookup(header: str | None, ring: KeyRing) -> Key | str:
    """The key the header names (valid or not), or why it names none."""
    if header is None or not header.strip():
        return f"Missing API key: {HOW}"
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return f"Malformed Authorization header: {HOW}"
    key = ring.by_hash.get(digest(token))
    return "Incorrect API key provided" if key is None else key


def checked(key: Key, now: float) -> Caller | str:
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
        # The headers of known keys seen lately, with their callers: a repeat costs a dict
        # lookup and the validity check, not a hash and a new Caller. Emptied whenever the
        # key table changes (a revocation takes effect at once) and when it grows past
        # REMEMBERED headers (a client sending random keys cannot grow it without bound).
        self._seen: dict[str, tuple[Key, Caller]] = {}
        self._version = ring.version

    def caller(self, header: str | None) -> Caller:
        if not self.required and not self.ring.by_hash:
            return ANONYMOUS  # no keys at all: nothing to look up
        if self.ring.version != self._version:
            self._seen.clear()
            self._version = self.ring.version
        now = self._clock()
        seen = self._seen.get(header) if header is not None else None
        if seen is not None and seen[0].valid(now):
            return seen[1]
        key = lookup(header, self.ring)
        found = key if isinstance(key, str) else checked(key, now)
        if isinstance(found, Caller):
            if len(self._seen) >= REMEMBERED:
                self._seen.clear()
            if header is not None and isinstance(key, Key):
                self._seen[header] = (key, found)
            return found
        if self.required:
            raise Unauthorized(found)
        return ANONYMOUS
