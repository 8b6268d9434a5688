"""A rollout shared by replicas through Redis: its record, one driver at a time, and every
replica's samples (`[state] backend = "redis"`).

Keys, under `<key_prefix>:` as the rest of the shared state:

- `rollout`: the current (or last) rollout's record, as JSON; `rollouts`: every record by id;
  `serving`: the revision each cell serves where a rollout changed it, as a JSON object;
- `rollout:lease`: the name of the process that drives the rollout, expiring after
  `[state].replica_ttl` unless renewed (the driver renews it every tick). A record is written
  only by a script that checks the lease first, in the same step: a driver that lost its
  lease (cut off, or stalled past the TTL while another took over) cannot write over its
  successor's steps;
- `rollout:commands`: operators' pause, resume and abort asked through a replica that does
  not drive, for the driver to act on at its next tick;
- `rollout:samples`: each process's windows of the rollout's answers by process, so the
  driver judges the answers of every replica; a crashed one's last windows stay counted.

Every record write increments the state's `version` and notifies on its channel, so every
replica hears of a new step at once (and re-reads once a second, as it does the rest).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.exceptions import RedisError

from gateway.admin.shared import SharedStore, StoreUnavailable
from gateway.config.state import StateConfig
from gateway.rollout.ports import LostLease

SAMPLES_KEPT_MS = 24 * 3600 * 1000  # a rollout's samples outlive it by this much at most

# KEYS: lease, current, history, serving, version. ARGV: this process, the id, the record
# ("" = unchanged), the serving map ("" = unchanged), the channel. -1: the lease is not this
# process's.
_PUT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[2], ARGV[3])
  redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
end
if ARGV[4] ~= '' then redis.call('SET', KEYS[4], ARGV[4]) end
local version = redis.call('INCR', KEYS[5])
redis.call('PUBLISH', ARGV[5], 'changed')
return version
"""

# KEYS: lease, commands, samples. ARGV: this process, the lease's TTL (ms), its windows ("" =
# none), how long samples are kept (ms). nil: the lease is not this process's.
_TICK = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
end
local commands = redis.call('LRANGE', KEYS[2], 0, -1)
redis.call('DEL', KEYS[2])
return {commands, redis.call('HGETALL', KEYS[3])}
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(slots=True)
class Found:
    """What the store holds of rollouts: the current record and the cells' revisions (the
    shape the driver's `restore` reads; `rollouts` holds only the current record)."""

    rollouts: dict[str, dict[str, Any]] = field(default_factory=dict)
    serving: dict[str, str] = field(default_factory=dict)
    driver: str | None = None  # the process holding the lease, if any

    @property
    def current(self) -> dict[str, Any] | None:
        return next(iter(self.rollouts.values()), None)


class SharedRollouts:
    """The Redis side of a shared rollout (gateway/rollout/ports.py's `Link`)."""

    def __init__(self, store: SharedStore, config: StateConfig) -> None:
        self._store = store
        self._client = store.client
        self.replica = store.replica
        self.instance = f"{store.replica}/{secrets.token_hex(4)}"  # this process
        self._ttl_ms = int(config.replica_ttl * 1000)
        self.ttl = config.replica_ttl
        self._lease = store.key("rollout:lease")
        self._current = store.key("rollout")
        self._history = store.key("rollouts")
        self._serving = store.key("serving")
        self._commands = store.key("rollout:commands")
        self._samples = store.key("rollout:samples")
        self._put = self._client.register_script(_PUT)
        self._tick = self._client.register_script(_TICK)
        self._release = self._client.register_script(_RELEASE)

    async def load(self) -> Found:
        """The current record, the serving map and who drives, read in one transaction."""
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.get(self._current)
                pipe.get(self._serving)
                pipe.get(self._lease)
                current, serving, lease = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{self._store.where} is unreachable: {exc}") from None
        found = Found(driver=None if lease is None else lease.decode())
        if current is not None:
            record = orjson.loads(current)
            found.rollouts[str(record["id"])] = record
        if serving is not None:
            found.serving = {str(c): str(r) for c, r in orjson.loads(serving).items()}
        return found

    async def history(self) -> list[dict[str, Any]]:
        """Every rollout's record, oldest first."""
        try:
            raw: dict[bytes, bytes] = await self._client.hgetall(self._history)  # type: ignore[assignment]
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{self._store.where} is unreachable: {exc}") from None
        records = [orjson.loads(r) for r in raw.values()]
        return sorted(records, key=lambda r: float(r.get("started", 0.0)))

    async def acquire(self) -> bool:
        """Take the lease if nobody holds it (the driver gone, or no rollout running)."""
        try:
            taken = await self._client.set(self._lease, self.instance, nx=True, px=self._ttl_ms)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{self._store.where} is unreachable: {exc}") from None
        return bool(taken)

    async def release(self) -> None:
        """Give the lease up (the rollout ended, or this process stops): another replica may
        drive at once rather than after the TTL."""
        try:
            await self._release(keys=[self._lease], args=[self.instance])
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{self._store.where} is unreachable: {exc}") from None

    async def put_rollout(self, rollout: str, started: float, record: dict[str, Any]) -> None:
        """The record, if this process still holds the lease (LostLease if not)."""
        await self._write(rollout, record, None)

    async def set_serving(self, serving: dict[str, str]) -> None:
        """The cells' revisions, as a rollout that succeeded leaves them (lease checked)."""
        await self._write("", None, serving)

    async def _write(
        self, rollout: str, record: dict[str, Any] | None, serving: dict[str, str] | None
    ) -> None:
        keys = [self._lease, self._current, self._history, self._serving]
        args: list[bytes | str] = [self.instance, rollout]
        args.append(b"" if record is None else orjson.dumps(record))
        args += [b"" if serving is None else orjson.dumps(serving), self._store.channel]
        try:
            version = await self._put(keys=[*keys, self._store.key("version")], args=args)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{self._store.where} is unreachable: {exc}") from None
        if int(version) < 0:
            raise LostLease(f"another process drives rollout {rollout or 'the rollout'} now")

    async def tick(
        self, windows: dict[str, Any] | None
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The driver's look, each tick: the lease renewed (LostLease if it is gone), this
        process's windows written, the operators' commands taken, every process's windows."""
        keys = [self._lease, self._commands, self._samples]
        wire = b"" if windows is None else orjson.dumps(windows)
        args: list[bytes | str | int] = [self.instance, self._ttl_ms, wire, SAMPLES_KEPT_MS]
        try:
            found = await self._tick(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{self._store.where} is unreachable: {exc}") from None
        if found is None:
            raise LostLease("the rollout's lease expired or was taken")
        commands, flat = found
        return [orjson.loads(c) for c in commands], _by_process(flat)

    async def publish(self, windows: dict[str, Any]) -> None:
        """A replica that does not drive: its windows, for the driver to add up."""
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.hset(self._samples, self.instance, orjson.dumps(windows))
                pipe.pexpire(self._samples, SAMPLES_KEPT_MS)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{self._store.where} is unreachable: {exc}") from None

    async def clear_samples(self) -> None:
        try:
            await self._client.delete(self._samples)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{self._store.where} is unreachable: {exc}") from None

    async def command(self, verb: str, rollout: str, who: str) -> None:
        """Ask the driving replica to pause, resume or abort at its next tick."""
        ask = orjson.dumps({"verb": verb, "id": rollout, "who": who})
        try:
            await self._client.rpush(self._commands, ask)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{self._store.where} is unreachable: {exc}") from None


def _by_process(flat: list[bytes]) -> dict[str, Any]:
    """HGETALL's flat [field, value, ...] reply as {process: windows}."""
    return {flat[i].decode(): orjson.loads(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}
