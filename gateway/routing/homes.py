"""Which unit holds which stored response: a bounded map with an expiry, on a clock passed in.

A stock vLLM keeps the responses it stored (`store`, `background`) in its own memory, so a read
of one (`GET /v1/responses/{id}`), its cancel, and a follow-up naming it
(`previous_response_id`) can only be answered by the unit that made it. The gateway learns the
pair from each answer and keeps at most `limit` of them, the least recently used dropped first,
each for `ttl` seconds after it was last used (a unit's store is lost with the unit anyway).
Pure and synchronous: the caller passes the time.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

U = TypeVar("U")


class Homes(Generic[U]):
    __slots__ = ("_homes", "limit", "ttl")

    def __init__(self, limit: int, ttl: float) -> None:
        self.limit = limit
        self.ttl = ttl
        self._homes: OrderedDict[str, tuple[U, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._homes)

    def learn(self, response_id: str, home: U, now: float) -> None:
        homes = self._homes
        homes[response_id] = (home, now + self.ttl)
        homes.move_to_end(response_id)
        while len(homes) > self.limit:
            homes.popitem(last=False)

    def get(self, response_id: str, now: float) -> U | None:
        """The unit that holds it (its expiry renewed), or None: never seen, or expired."""
        found = self._homes.get(response_id)
        if found is None:
            return None
        home, expires = found
        if expires <= now:
            del self._homes[response_id]
            return None
        self.learn(response_id, home, now)
        return home
