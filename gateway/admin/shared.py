"""Admin overrides in Redis, shared by every replica of the gateway (`[state] backend = "redis"`).

Layout, every key under `<key_prefix>:`:

- `version`: a counter; every write increments it in the same transaction (MULTI/EXEC), so
  writes made through any replicas fall into one total order;
- `marks`, `added`, `removed`: hashes by unit id, the same records the SQLite store keeps;
- `keys`: the data-plane API keys by id (their hashes, never their secrets), and
  `keys_version`, incremented with every key write, so a replica re-reads the keys (which
  may be many) only when they changed, not on every other write or once-a-second re-read;
- `changes`: the channel each write publishes on, in its transaction;
- `events`: the fleet's events log, a stream (`gateway/admin/shared_log.py`); an admin write
  appends its event in its own transaction, so the log's order is the versions' order;
- `replicas`, `replica:<name>`: each live replica's report (`gateway/admin/replicas.py`).

A replica never applies a write by itself: after its own write and on every notification it
reads the whole state (small: one record per overridden unit) in one transaction and converges
to it, so whatever order notifications arrive in, every replica ends in the state of the
latest version. It also re-reads once a second, which repairs a missed notification and
finds a silent partition. While Redis is unreachable a replica keeps serving on its last
state, and writes fail with `StoreUnavailable` (503) naming the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import redis.asyncio as redis
from redis.exceptions import RedisError

from gateway.admin.shared_log import entry, parse
from gateway.admin.state import AddedUnit, Mark, Removal, Saved, saved_mark
from gateway.admin.store import StoreError
from gateway.auth.keys import Key, from_record
from gateway.config.state import StateConfig
from gateway.observability.events import Event

log = logging.getLogger("unitgate.admin")

RECONCILE_EVERY_S = 1.0
# Reconnect backoff while Redis is away. The cap is the longest a replica can stay deaf once
# the store is back (it hears nothing until its next attempt), so it must sit well inside the
# 1 s convergence the fleet promises: at 2 s, chaos scenario 13 (a 3.5 s outage) measured
# 1.6 s. An attempt against a store that is down is one refused connect, cheap at 2 per second.
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 0.5


class StoreUnavailable(StoreError):
    """The shared store cannot be reached: the write was not made anywhere."""


class SharedStore:
    def __init__(self, config: StateConfig) -> None:
        self.where = f"the state store at {config.url} (key prefix {config.key_prefix!r})"
        self._prefix = config.key_prefix
        self.replica = config.replica_name()
        self.events_kept = config.events_kept
        self.channel = f"{config.key_prefix}:changes"
        self.client: redis.Redis = redis.Redis.from_url(config.url, **config.client_options())
        self._stopping = False
        self._wake = asyncio.Event()  # a notification came, or `stop` was asked

    def key(self, name: str) -> str:
        return f"{self._prefix}:{name}"

    async def load(self, keys_seen: int = -1) -> tuple[int, Saved, int | None]:
        """(version, everything, the keys' version) read in one transaction: a consistent
        snapshot. The keys are read (into `Saved.keys`) only when their version is not
        `keys_seen`; otherwise the keys' version is None and `Saved.keys` empty."""
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.get(self.key("version"))
                pipe.get(self.key("keys_version"))
                for name in ("marks", "added", "removed"):
                    pipe.hgetall(self.key(name))
                version, keys_version, marks, added, removed = await pipe.execute()
            found: int | None = int(keys_version or 0)
            keys: dict[bytes, bytes] = {}
            if found != keys_seen:
                found, keys = await self._keys()
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{self.where} is unreachable: {exc}") from None
        try:
            saved = _saved(marks, added, removed)
            saved.keys = _keys(keys)
            return int(version or 0), saved, None if found == keys_seen else found
        except (ValueError, TypeError, KeyError) as exc:  # a record this gateway cannot read
            raise StoreError(f"{self.where} holds an unreadable record: {exc}") from None

    async def _keys(self) -> tuple[int, dict[bytes, bytes]]:
        """The keys and their version, in one transaction (a later write may have come
        since the rest was read: the next converge reads that one's units)."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.get(self.key("keys_version"))
            pipe.hgetall(self.key("keys"))
            version, keys = await pipe.execute()
        return int(version or 0), keys

    async def put_key(self, key: Key, event: Event) -> int:
        """A key made, or changed (revoked)."""
        record = orjson.dumps(key.record())

        def write(pipe: Any) -> None:
            pipe.hset(self.key("keys"), key.id, record)
            pipe.incr(self.key("keys_version"))

        return await self._write(write, event)

    async def set_mark(self, unit: str, mark: Mark | None, event: Event) -> int:
        """`mark` None: back to the unit's configured state (nothing to override)."""
        if mark is None:
            return await self._write(lambda p: p.hdel(self.key("marks"), unit), event)
        record = orjson.dumps([mark.state, mark.reason, mark.who, mark.since])
        return await self._write(lambda p: p.hset(self.key("marks"), unit, record), event)

    async def add(self, unit: str, added: AddedUnit, event: Event) -> int:
        record = orjson.dumps([added.config, added.who, added.since])

        def write(pipe: Any) -> None:
            pipe.hset(self.key("added"), unit, record)
            pipe.hdel(self.key("removed"), unit)

        return await self._write(write, event)

    async def remove(self, unit: str, configured: Removal | None, event: Event) -> int:
        def write(pipe: Any) -> None:
            pipe.hdel(self.key("added"), unit)
            pipe.hdel(self.key("marks"), unit)
            if configured is not None:
                record = orjson.dumps([configured.who, configured.since])
                pipe.hset(self.key("removed"), unit, record)

        return await self._write(write, event)

    def append_event(self, pipe: Any, event: Event) -> None:
        """Queue an XADD of `event` (by this replica) on `pipe`, trimming the log to its bound."""
        fields = entry(event, self.replica)
        pipe.xadd(self.key("events"), fields, maxlen=self.events_kept, approximate=True)

    async def _write(self, commands: Callable[[Any], object], event: Event) -> int:
        """One transaction: the change, its event, the next version, and its notification."""
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                commands(pipe)
                self.append_event(pipe, event)
                pipe.incr(self.key("version"))
                pipe.publish(self.channel, b"changed")
                results = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{self.where} is unreachable: {exc}") from None
        return int(results[-2])

    async def events(self, limit: int, unit: str | None = None) -> list[Event]:
        """The latest `limit` events of the fleet (of one unit: among the log's whole bound),
        oldest first."""
        count = self.events_kept if unit is not None else limit
        try:
            raw: list[tuple[bytes, dict[bytes, bytes]]] = await self.client.xrevrange(
                self.key("events"), count=count
            )  # type: ignore[assignment]  # redis-py types replies for decoded clients too
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{self.where} is unreachable: {exc}") from None
        try:
            found = [parse(fields) for _, fields in raw]
        except (ValueError, KeyError, UnicodeDecodeError) as exc:
            raise StoreError(f"{self.where} holds an unreadable event: {exc}") from None
        if unit is not None:
            found = [e for e in found if e.unit == unit][:limit]
        return found[::-1]

    async def follow(self, converge: Callable[[], Awaitable[None]]) -> None:
        """Call `converge` on every notification, every RECONCILE_EVERY_S, and on each
        (re)connection, until `stop`; reconnects with backoff while Redis is away."""
        delay = RETRY_FIRST_S
        while not self._stopping:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            listener: asyncio.Task[None] | None = None
            try:
                await pubsub.subscribe(self.channel)
                listener = asyncio.create_task(self._listen(pubsub), name="state-listen")
                await converge()
                delay = RETRY_FIRST_S
                log.info("following %s", self.where)
                while await self._woken(listener):
                    await converge()
            except (RedisError, OSError, StoreError) as exc:  # the follower never dies of it
                log.warning("lost %s (%s); serving on the last state", self.where, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)  # `stop` cuts it short
                delay = min(delay * 2, RETRY_MAX_S)
            finally:
                if listener is not None:
                    listener.cancel()
                    await asyncio.wait({listener}, timeout=RETRY_MAX_S)
                    if listener.done() and not listener.cancelled():
                        listener.exception()  # seen: the error that ended it is logged above
                # Typed through a variable: redis-py before 8.2 leaves aclose untyped.
                close: Callable[[], Awaitable[None]] = pubsub.aclose
                with contextlib.suppress(RedisError, OSError):
                    await close()

    async def _listen(self, pubsub: Any) -> None:
        """Wake the follower on every notification. A blocking read: no timer and no poll
        while nothing changes, and no timeout context, which in redis-py can swallow a
        cancellation (the task is cancelled when its connection is left)."""
        async for _ in pubsub.listen():
            self._wake.set()

    async def _woken(self, listener: asyncio.Task[None]) -> bool:
        """Until a notification, `stop`, or RECONCILE_EVERY_S; False once stopping. Raises
        what ended the listener (its connection was lost), so the follower reconnects."""
        if self._stopping:
            return False
        waiting = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait(
                {waiting, listener}, timeout=RECONCILE_EVERY_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiting.cancel()
        self._wake.clear()
        if listener.done():
            listener.result()  # its error, if it died of one
            raise StoreUnavailable(f"{self.where} closed the notification stream")
        return not self._stopping

    def stop(self) -> None:
        """Ask `follow` to return (at once, or after the converge it is in)."""
        self._stopping = True
        self._wake.set()

    async def close(self) -> None:
        await self.client.aclose()


def _keys(raw: dict[bytes, bytes]) -> dict[str, Key]:
    keys = (from_record(orjson.loads(record)) for record in raw.values())
    return {key.id: key for key in keys}


def _saved(
    marks: dict[bytes, bytes], added: dict[bytes, bytes], removed: dict[bytes, bytes]
) -> Saved:
    saved = Saved()
    for unit, raw in marks.items():
        saved.marks[unit.decode()] = saved_mark(unit.decode(), *orjson.loads(raw))
    for unit, raw in added.items():
        config, who, since = orjson.loads(raw)
        saved.added[unit.decode()] = AddedUnit(config, who, float(since))
    for unit, raw in removed.items():
        who, since = orjson.loads(raw)
        saved.removed[unit.decode()] = Removal(who, float(since))
    return saved
