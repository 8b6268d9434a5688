"""Helpers of the limits tests: a store that can be taken away, and a simulated fleet of
limiters ("replicas") sharing one store, driven on a fake clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.config.limits import LimitsConfig
from gateway.limits.decisions import Grant, KeyLimits, Refusal
from gateway.limits.limiter import Limiter
from gateway.limits.store import Answer, Ask, Changes, Store, StoreDown

T0 = 1_000_000.0


class FlakyStore:
    """Wraps a store; while `down`, every call raises StoreDown."""

    shared = True  # stands for a fleet's store

    def __init__(self, inner: Store) -> None:
        self.inner, self.down = inner, False

    async def take(self, key: str, asks: Sequence[Ask], now: float) -> list[Answer]:
        if self.down:
            raise StoreDown("taken away by the test")
        return await self.inner.take(key, asks, now)

    async def push(self, changes: Changes, now: float) -> None:
        if self.down:
            raise StoreDown("taken away by the test")
        await self.inner.push(changes, now)

    async def census(self, now: float) -> int:
        if self.down:
            raise StoreDown("taken away by the test")
        return await self.inner.census(now)

    async def close(self) -> None:
        await self.inner.close()


@dataclass
class Fleet:
    """Limiters sharing stores' counts, each flushed every `flush_every` simulated seconds."""

    limiters: list[Limiter]
    flush_every: float = 0.1
    now: float = T0
    grants: list[tuple[float, int, Grant]] = field(default_factory=list)
    refusals: list[tuple[float, Refusal]] = field(default_factory=list)
    _flushed: float = T0

    async def advance(self, to: float) -> None:
        """Move the clock to `to`, flushing every replica at each interval on the way."""
        while self._flushed + self.flush_every <= to:
            self._flushed += self.flush_every
            self.now = self._flushed
            for limiter in self.limiters:
                await limiter.flush(self.now)
        self.now = to

    async def admit(self, replica: int, key: str, limits: KeyLimits, tokens: int) -> Grant | None:
        answer = await self.limiters[replica].admit(key, limits, tokens, self.now)
        if isinstance(answer, Grant):
            self.grants.append((self.now, replica, answer))
            return answer
        self.refusals.append((self.now, answer))
        return None

    def settle(self, replica: int, grant: Grant, tokens: int) -> None:
        self.limiters[replica].settle(grant, tokens)

    @classmethod
    def of(cls, stores: Sequence[Store], limits_config: LimitsConfig | None = None) -> Fleet:
        fleet = cls([], flush_every=(limits_config or LimitsConfig()).flush_interval)
        fleet.limiters = [
            Limiter(store, limits_config, live_replicas=lambda: len(stores), clock=fleet.clock)
            for store in stores
        ]
        return fleet

    def clock(self) -> float:
        return self.now

    def admitted_in(self, start: float, end: float) -> int:
        return sum(1 for t, _, _ in self.grants if start <= t <= end)
