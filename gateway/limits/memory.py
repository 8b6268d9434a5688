"""The shared counts in this process's memory: the store of a gateway that runs alone.

Several `MemoryStore`s may share one `Counts` (each with its own replica name): the tests use
that to run "replicas" against one store on a fake clock. The arithmetic is window.py's and
lease.py's, the same the Redis store's Lua mirrors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.limits import window
from gateway.limits.lease import lease_extra
from gateway.limits.store import Answer, Ask, Changes, Dim


@dataclass(slots=True)
class Counts:
    windows: dict[tuple[str, Dim], dict[int, int]] = field(default_factory=dict)
    # key -> replica -> (slots held, expires at)
    slots: dict[str, dict[str, tuple[int, float]]] = field(default_factory=dict)
    ops: int = 0  # calls made (take or push), for the tests' and benchmark's round trip counts


class MemoryStore:
    shared = False  # its counts are this process's own: no census to keep

    def __init__(self, replica: str = "local", ttl: float = 3.0, counts: Counts | None = None):
        self.replica, self.ttl = replica, ttl
        self.counts = counts if counts is not None else Counts()

    async def take(self, key: str, asks: Sequence[Ask], now: float) -> list[Answer]:
        return self.take_now(key, asks, now)

    async def push(self, changes: Changes, now: float) -> None:
        self.push_now(changes, now)

    async def census(self, now: float) -> int:
        return 1  # this process's own counts: nobody shares them

    async def close(self) -> None:
        return None

    def take_now(self, key: str, asks: Sequence[Ask], now: float) -> list[Answer]:
        self.counts.ops += 1
        answers = [self._look(key, ask, now) for ask in asks]
        if any(a.frees_at != now for a in answers):
            self._tidy(key)
            return answers
        granted = []
        for ask, answer in zip(asks, answers, strict=True):
            room = ask.limit - answer.used - ask.need
            amount = ask.need + lease_extra(room, ask.cap, ask.fraction)
            self._charge(key, ask, amount, now)
            granted.append(Answer(amount, answer.used, answer.frees_at, answer.empty_at))
        return granted

    def push_now(self, changes: Changes, now: float) -> None:
        self.counts.ops += 1
        now_bucket = window.bucket_of(now)
        for (key, dim, bucket), delta in changes.deltas.items():
            counts = self.counts.windows.setdefault((key, dim), {})
            window.add(counts, bucket, delta, now_bucket)
        for key, held in changes.held.items():
            self._hold(key, held, now)
        for key in {key for key, _, _ in changes.deltas} | changes.held.keys():
            self._tidy(key)

    def _tidy(self, key: str) -> None:
        """Forget a key's empty windows and slots (a key seen once does not stay forever)."""
        for dim in ("requests", "tokens"):
            if not self.counts.windows.get((key, dim), True):
                del self.counts.windows[(key, dim)]
        if not self.counts.slots.get(key, True):
            del self.counts.slots[key]

    def _look(self, key: str, ask: Ask, now: float) -> Answer:
        if ask.dim == "inflight":
            used = sum(held for held, _ in self._live_slots(key, now).values())
            fits = used + ask.need <= ask.limit
            return Answer(0, used, now if fits else now + 1.0, now)
        counts = self.counts.windows.setdefault((key, ask.dim), {})
        window.add(counts, window.bucket_of(now), 0, window.bucket_of(now))  # prune
        used = window.used(counts, window.bucket_of(now))
        frees = window.frees_at(counts, ask.limit, ask.need, now)
        return Answer(0, used, frees, window.empty_at(counts, now))

    def _charge(self, key: str, ask: Ask, amount: int, now: float) -> None:
        if ask.dim == "inflight":
            own = self._live_slots(key, now).get(self.replica, (0, now))[0]
            self._hold(key, own + amount, now)
        else:
            bucket = window.bucket_of(now)
            window.add(self.counts.windows[(key, ask.dim)], bucket, amount, bucket)

    def _live_slots(self, key: str, now: float) -> dict[str, tuple[int, float]]:
        entries = self.counts.slots.setdefault(key, {})
        for replica in [r for r, (_, expires) in entries.items() if expires < now]:
            del entries[replica]
        return entries

    def _hold(self, key: str, held: int, now: float) -> None:
        entries = self._live_slots(key, now)
        if held > 0:
            entries[self.replica] = (held, now + self.ttl)
        else:
            entries.pop(self.replica, None)
