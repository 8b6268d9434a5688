"""Each live replica's report to the fleet, and the fleet-wide "safe to remove" built on them.

Every replica writes, each `[state].heartbeat` and right after it converges to a new state
version, one report: the version it routes by and its in-flight count per unit, taken at the
same instant. The report's key expires after `replica_ttl`, so a replica that crashed or lost
Redis stops counting once that passes, and one that stops cleanly removes its own.

Why the version is in the report: a count alone cannot tell "0 in flight, and it will admit no
more" from "0 in flight, and it has not heard of the drain yet". A replica that reports a
version at least the drain's has applied it, so from that report on it admits nothing there;
its count can only fall. `drained` is true only when every live replica's report is that
current and shows 0 on the unit: the fleet's real "safe to remove".

What this cannot see, and docs/operating.md says: a replica cut off from Redis for longer than
`replica_ttl` while it still serves. It cannot hear of the drain either; the operator must
know their partitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from redis.exceptions import RedisError

from gateway.admin.shared import SharedStore, StoreUnavailable
from gateway.config.state import StateConfig

log = logging.getLogger("unitgate.admin")


@dataclass(frozen=True, slots=True)
class Report:
    replica: str
    version: int  # the shared state version the replica routed by when it counted
    at: float  # Unix time of the count (its clock: shown as an age, never compared)
    inflight: Mapping[str, int]  # units with requests in flight on this replica


@dataclass(frozen=True, slots=True)
class FleetUnit:
    """One unit as the whole fleet sees it, for the version this replica is in."""

    in_flight: int  # over every live replica
    current: bool  # every live replica has applied this replica's state version
    replicas: Mapping[str, dict[str, Any]]  # per-replica view, for /admin/units

    @property
    def quiet(self) -> bool:
        """Nothing in flight on the unit anywhere, and nowhere can that change by itself."""
        return self.current and self.in_flight <= 0


@dataclass(frozen=True, slots=True)
class Fleet:
    """Every live replica's report, read by a replica in shared state `version`."""

    version: int
    reports: Mapping[str, Report]
    now: float  # Unix time of the reading

    def unit(self, unit: str) -> FleetUnit:
        return fleet_unit(self.reports, unit, self.version, self.now)


def fleet_unit(reports: Mapping[str, Report], unit: str, version: int, now: float) -> FleetUnit:
    views = {
        name: {
            "in_flight": r.inflight.get(unit, 0),
            "version": r.version,
            "age_s": round(max(0.0, now - r.at), 3),
        }
        for name, r in sorted(reports.items())
    }
    total = sum(r.inflight.get(unit, 0) for r in reports.values())
    current = all(r.version >= version for r in reports.values())
    return FleetUnit(total, current, views)


def encode(report: Report, instance: str = "") -> bytes:
    """`instance`: which process wrote it, so two gateways given one replica name are seen."""
    return orjson.dumps([report.version, report.at, dict(report.inflight), instance])


def decode(replica: str, raw: bytes) -> Report:
    version, at, inflight, *_ = orjson.loads(raw)
    counts = {str(unit): int(n) for unit, n in inflight.items()}
    return Report(replica, int(version), float(at), counts)


def writer(raw: bytes | None) -> str | None:
    """The instance that wrote a report (None if there is none, or it is unreadable)."""
    try:
        found = orjson.loads(raw) if raw is not None else None
    except orjson.JSONDecodeError:
        return None
    return str(found[3]) if isinstance(found, list) and len(found) > 3 else None


Counts = Callable[[], tuple[int, dict[str, int]]]  # (state version, in-flight per unit), at once


class Heartbeat:
    """This replica's reports, and the reading of everyone's."""

    def __init__(
        self,
        store: SharedStore,
        config: StateConfig,
        counts: Counts,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self.replica = store.replica
        self._every = config.heartbeat
        self._ttl_ms = int(config.replica_ttl * 1000)
        self._counts = counts
        self._clock = clock
        self._poked = asyncio.Event()
        self._instance = secrets.token_hex(8)
        self._clashes = 0  # beats in a row that found another gateway's report under our name

    def now(self) -> Report:
        version, inflight = self._counts()
        return Report(self.replica, version, self._clock(), inflight)

    def poke(self) -> None:
        """Report now rather than at the next beat (this replica just changed version)."""
        self._poked.set()

    async def run(self) -> None:
        """Until cancelled. Each `heartbeat` the counts are read (no I/O) and written only
        if they or the version changed, or to keep the report from expiring (every third of
        `replica_ttl`): an idle replica writes once a second, a busy one up to 1/heartbeat.
        A failed write is retried at the next look (the follower logs the store's outages)."""
        written: tuple[int, Mapping[str, int]] | None = None
        written_at = -math.inf
        loop = asyncio.get_running_loop()
        while True:
            self._poked.clear()
            report = self.now()
            keep_alive = loop.time() - written_at >= self._ttl_ms / 3000
            if (report.version, report.inflight) != written or keep_alive:
                try:
                    await self.beat(report)
                    written, written_at = (report.version, report.inflight), loop.time()
                except (RedisError, OSError) as exc:
                    log.debug("heartbeat not written: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poked.wait(), self._every)

    async def beat(self, report: Report | None = None) -> None:
        report = report or self.now()
        async with self._store.client.pipeline(transaction=True) as pipe:
            raw = encode(report, self._instance)
            pipe.set(self._key(self.replica), raw, px=self._ttl_ms, get=True)
            pipe.sadd(self._store.key("replicas"), self.replica)
            before, _ = await pipe.execute()
        self._check_name(writer(before))

    def _check_name(self, previous: str | None) -> None:
        """Two gateways reporting under one name overwrite each other's counts, and a drain
        could be called done while one of them still streams: say so, loudly, once. Twice in
        a row, since the first beat after a crash and a restart finds the dead process's."""
        clash = previous is not None and previous != self._instance
        self._clashes = self._clashes + 1 if clash else 0
        if self._clashes == 2:
            log.error(
                "another gateway reports as replica %r: give each replica its own "
                "[state].replica (or leave it empty: <hostname>:<pid>); until then a drain "
                "may be reported done while one of them still streams",
                self.replica,
            )

    async def fleet(self) -> Fleet:
        """StoreUnavailable if Redis cannot be read: then nobody can say the fleet is drained."""
        reports = await self.reports()
        return Fleet(reports[self.replica].version, reports, self._clock())

    async def reports(self) -> dict[str, Report]:
        """Every live replica's latest report, this one's taken now; StoreUnavailable if
        Redis cannot be read (then nobody can say the fleet is drained)."""
        try:
            # redis-py types its replies for decoding clients too: this one returns bytes.
            members: set[bytes] = await self._store.client.smembers(self._members)  # type: ignore[assignment]
            names = sorted(n.decode() for n in members)
            keys = [self._key(n) for n in names]
            raw: list[bytes | None] = await self._store.client.mget(keys) if names else []  # type: ignore[assignment]
            gone = [n for n, r in zip(names, raw, strict=True) if r is None]
            if gone:  # expired: crashed, or cut off for longer than replica_ttl
                await self._store.client.srem(self._members, *gone)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{self._store.where} is unreachable: {exc}") from None
        found: dict[str, Report] = {}
        for name, value in zip(names, raw, strict=True):
            if value is None or name == self.replica:
                continue
            try:
                found[name] = decode(name, value)
            except (ValueError, TypeError, AttributeError) as exc:
                # Not current: it keeps the fleet from being called drained, never the reverse.
                log.warning("replica %s's report is unreadable: %s", name, exc)
                found[name] = Report(name, -1, 0.0, {})
        found[self.replica] = self.now()
        return found

    async def leave(self) -> None:
        """At a clean stop: this replica no longer counts (it has nothing in flight)."""
        try:
            async with self._store.client.pipeline(transaction=True) as pipe:
                pipe.delete(self._key(self.replica))
                pipe.srem(self._members, self.replica)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning("could not remove this replica's report (it expires by itself): %s", exc)

    @property
    def _members(self) -> str:
        return self._store.key("replicas")

    def _key(self, replica: str) -> str:
        return self._store.key(f"replica:{replica}")
