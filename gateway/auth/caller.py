"""Who a request is from, as the request path's later phases (priority, limits) read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str  # "anonymous" without a (valid) key
    key_id: str | None
    highest: str | None  # the key's top priority class; None = no clamp
    default: str  # the key's default class; "" = [priority].default
    rpm: int | None = None
    tpm: int | None = None
    max_inflight: int | None = None


ANONYMOUS = Caller("anonymous", None, None, "")
