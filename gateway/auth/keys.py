"""An API key's record: what the store keeps and workers are sent, never the secret itself.

A key is `ug-` and 32 random bytes (base64url): with that much entropy a plain SHA-256 is the
right hash (nothing to brute-force, and one hash per request costs a microsecond), and its hex
digest is what a request's key is looked up by. The record keeps a short display prefix
(`ug-AbCd…`) so an operator can tell keys apart in a list without the secret.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import asdict, dataclass, replace
from typing import Any

from gateway.auth.caller import Caller

PREFIX = "ug-"
SHOWN = 4  # characters of the secret after PREFIX kept for display


def new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "replace")).hexdigest()


def new_id() -> str:
    return "key_" + secrets.token_hex(6)


def shown(secret: str) -> str:
    return secret[: len(PREFIX) + SHOWN] + "…"


@dataclass(frozen=True, slots=True)
class Key:
    id: str
    hash: str  # sha256 hex of the secret
    prefix: str  # for display: "ug-AbCd…"
    tenant: str
    priority: str  # the highest class its requests may run in
    default_priority: str  # the class of its requests that ask for none
    rpm: int | None  # None = unlimited
    tpm: int | None
    max_inflight: int | None
    expires: float | None  # Unix time; None = never
    created: float
    who: str  # the admin token's name that made it
    revoked: float | None = None  # Unix time of its revocation
    revoked_by: str = ""

    def valid(self, now: float) -> bool:
        return self.revoked is None and (self.expires is None or now < self.expires)

    def state(self, now: float) -> str:
        if self.revoked is not None:
            return "revoked"
        return "active" if self.valid(now) else "expired"

    def caller(self) -> Caller:
        return Caller(
            self.tenant, self.id, self.priority, self.default_priority,
            self.rpm, self.tpm, self.max_inflight,
        )  # fmt: skip

    def revoke(self, when: float, who: str) -> Key:
        return replace(self, revoked=when, revoked_by=who)

    def record(self) -> dict[str, Any]:
        """What the store keeps and workers are sent (the hash, never the secret)."""
        return asdict(self)

    def view(self, now: float) -> dict[str, Any]:
        """What the admin API shows: the record without its hash, and its state."""
        found = asdict(self)
        del found["hash"]
        found["state"] = self.state(now)
        return found


def from_record(record: dict[str, Any]) -> Key:
    """A record read back (store, worker link); TypeError or ValueError if it is not one."""
    key = Key(**record)
    if not isinstance(key.id, str) or not isinstance(key.hash, str) or len(key.hash) != 64:
        raise ValueError(f"not a key record: {key.id!r}")
    return key
