"""Who a request is from, as the request path's later phases (priority, limits) read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.limits.decisions import KeyLimits


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str  # "anonymous" without a (valid) key
    key_id: str | None
    highest: str | None  # the key's top priority class; None = no clamp
    default: str  # the key's default class; "" = [priority].default
    rpm: int | None = None
    tpm: int | None = None
    max_inflight: int | None = None
    limits: KeyLimits = field(init=False, compare=False)  # the three, as the limiter reads them

    def __post_init__(self) -> None:
        object.__setattr__(self, "limits", KeyLimits(self.rpm, self.tpm, self.max_inflight))


ANONYMOUS = Caller("anonymous", None, None, "")
