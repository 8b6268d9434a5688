"""Settings of the limits engine: `[limits]` (the limits per key come with the keys).

A process takes leases from the shared window instead of one unit per request: a lease is
`lease_share` of the room the limit leaves, split among the live replicas, at most
`lease_max_requests` requests or `lease_max_tokens` tokens. What is returned, settled or
admitted while the store was away is sent every `flush_interval` seconds, in one call.
With the store unreachable each replica enforces limit // live replicas by itself (the
fallback is documented in gateway/limits/limiter.py; there is no "unlimited" choice).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.checks import check, positive


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    lease_share: float = 0.5  # of the room left, split among the live replicas
    lease_max_requests: int = 100
    lease_max_tokens: int = 100_000
    flush_interval: float = 0.25  # seconds between batches of returns and settles
    slots_ttl: float = 3.0  # a replica's in-flight slots are let go this long after its last word

    def __post_init__(self) -> None:
        check(0.0 <= self.lease_share <= 1.0, "lease_share", self.lease_share, "must be in [0, 1]")
        check(
            self.lease_max_requests >= 0,
            "lease_max_requests",
            self.lease_max_requests,
            "must be >= 0",
        )
        check(self.lease_max_tokens >= 0, "lease_max_tokens", self.lease_max_tokens, "must be >= 0")
        positive("flush_interval", self.flush_interval)
        check(
            self.slots_ttl >= 4 * self.flush_interval,
            "slots_ttl",
            self.slots_ttl,
            f"must be at least 4 flush intervals ({4 * self.flush_interval:g} s), or a busy "
            "replica's slots expire between two of its reports",
        )
