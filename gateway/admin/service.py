"""Operator actions on units: the one writer of the `enabled` and `draining` bits.

Probe health and the breaker's verdict are other components' bits; nothing here touches them,
so enabling a unit makes it routable only once those agree too. Each action is validated,
saved, then applied, under one lock: a failed save leaves the gateway as it was, and two
operators acting at once cannot interleave half-done changes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from gateway.admin.errors import AdminError, AdminStartError, bad_request, conflict, unknown_unit
from gateway.admin.replicas import Fleet, Heartbeat
from gateway.admin.shared import SharedStore
from gateway.admin.state import BITS, AddedUnit, Mark, Removal, Saved, State
from gateway.admin.store import Store, StoreError
from gateway.auth.keys import Key
from gateway.auth.ring import KeyRing
from gateway.config import Config, ConfigError, UnitConfig
from gateway.config.builder import build, table
from gateway.observability.events import Event, EventLog
from gateway.units import Bit, UnitRegistry, UnitState

log = logging.getLogger("unitgate.admin")

VERBS: dict[State, str] = {"enabled": "enable", "disabled": "disable", "draining": "drain"}


class AdminService:
    def __init__(
        self,
        config: Config,
        units: UnitRegistry,
        events: EventLog,
        clock: Callable[[], float] = time.time,
        keys: KeyRing | None = None,
    ) -> None:
        self.config = config
        self.units = units
        self.events = events
        self.keys = KeyRing() if keys is None else keys  # the data plane's API keys
        self._keys_version = -1  # of the shared state's keys last read
        self._served = config.gateway.models
        self._configured = {u.id for u in config.units}
        self._clock = clock
        self._store: Store | None = None
        self._shared: SharedStore | None = None
        self._heartbeat: Heartbeat | None = None
        self._version = 0  # of the shared state last converged to
        self._on_version: list[Callable[[int], None]] = []
        self._lock = asyncio.Lock()
        now = clock()
        self.marks = {u.id: _initial(u.config, now) for u in units.units.values()}

    def unit(self, unit_id: str) -> UnitState:
        unit = self.units.units.get(unit_id)
        if unit is None:
            raise unknown_unit(unit_id)
        return unit

    async def set_state(self, unit_id: str, state: State, reason: str, who: str) -> UnitState:
        """Disable, drain or enable; asking for the current state again changes nothing."""
        async with self._lock:
            unit = self.unit(unit_id)
            if self.marks[unit_id].state == state:
                return unit
            mark = Mark(state, reason, who, self._clock())
            if self._shared is not None:
                event = Event(mark.since, unit_id, VERBS[state], reason, who)
                override = None if _is_default(unit, mark) else mark
                await self._shared.set_mark(unit_id, override, event)
                await self._converge()
                return unit
            if self._store is not None:
                await self._store.set_mark(unit_id, None if _is_default(unit, mark) else mark)
            self._apply(unit, mark)
            self.events.record(unit_id, VERBS[state], reason, who)
            return unit

    async def add(self, body: object, who: str) -> UnitState:
        config = self.parse_unit(body)
        async with self._lock:
            if config.id in self.units.units:
                raise conflict(f"unit {config.id!r} already exists")
            added = AddedUnit(table(config), who, self._clock())
            if self._shared is not None:
                event = Event(added.since, config.id, "add", f"leader {config.leader}", who)
                await self._shared.add(config.id, added, event)
                await self._converge()
                return self.unit(config.id)
            if self._store is not None:
                await self._store.add(config.id, added)
            unit = self._add(config, added)
            self.events.record(config.id, "add", f"leader {config.leader}", who)
            return unit

    async def remove(self, unit_id: str, who: str) -> UnitState:
        """Out of the registry at once; requests already running on it finish normally."""
        async with self._lock:
            unit = self.unit(unit_id)
            now = self._clock()
            configured = Removal(who, now) if unit_id in self._configured else None
            if self._shared is not None:
                reason = f"{unit.inflight} in flight here may finish"
                await self._shared.remove(
                    unit_id, configured, Event(now, unit_id, "remove", reason, who)
                )
                await self._converge()
                return unit
            if self._store is not None:
                await self._store.remove(unit_id, configured)
            self.units.remove(unit_id)
            del self.marks[unit_id]
            self.events.record(unit_id, "remove", f"{unit.inflight} in flight may finish", who)
            return unit

    async def put_key(self, key: Key, what: str, who: str) -> None:
        """Save a key made or revoked, then apply it (`what`: the event, e.g. "key created")."""
        reason = f"tenant {key.tenant}"
        async with self._lock:
            if self._shared is not None:
                await self._shared.put_key(key, Event(self._clock(), key.id, what, reason, who))
                await self._converge()
                return
            if self._store is not None:
                await self._store.put_key(key)
            self.keys.put(key)
            self.events.record(key.id, what, reason, who)

    def parse_unit(self, body: object) -> UnitConfig:
        if not isinstance(body, dict):
            raise bad_request("the body must be a JSON object describing a unit")
        try:
            config: UnitConfig = build(
                UnitConfig, {k: v for k, v in body.items() if v is not None}, "body"
            )
        except ConfigError as exc:
            raise bad_request(str(exc)) from None
        if any(c.isspace() or c == "/" for c in config.id):  # it must fit in a URL path segment
            raise bad_request(f"[body].id must have no spaces or '/', got {config.id!r}")
        extra = sorted(set(config.models) - set(self._served))
        if extra:
            served = list(self._served)
            raise bad_request(f"[body].models {extra} are not served ([gateway].models = {served})")
        return config

    async def restore(self, store: Store) -> None:
        """Re-apply saved overrides before the listeners open; from now on save every action."""
        saved = await store.load()
        async with self._lock:
            self._restore_removed(saved)
            self._restore_added(saved, store)
            self._restore_marks(saved)
            self.keys.replace(saved.keys.values())
            self._store = store

    @property
    def converged_version(self) -> int:
        """The shared state's version this replica is in (0: none yet, or not shared)."""
        return self._version

    async def share(self, store: SharedStore, heartbeat: Heartbeat) -> None:
        """From now on every action goes through the shared store; state comes from it."""
        async with self._lock:
            self._shared = store
            self._heartbeat = heartbeat

    async def fleet(self) -> Fleet | str | None:
        """The replicas' reports, read once this replica is in the latest state (so a drain
        is judged against the newest version); why they cannot be read; None unshared."""
        if self._heartbeat is None:
            return None
        try:
            await self.converge()
            return await self._heartbeat.fleet()
        except StoreError as exc:
            return f"the fleet's in-flight counts are unknown: {exc}"

    async def busy(self, units: Sequence[UnitState]) -> list[str]:
        """The units with answers in flight: on any replica where the state is shared (every
        one of them, while the replicas' reports cannot be read), else here."""
        fleet = await self.fleet()
        if fleet is None:
            return [u.id for u in units if u.inflight > 0]
        if isinstance(fleet, str):
            return [u.id for u in units]
        return [u.id for u in units if not fleet.unit(u.id).quiet]

    async def converge(self) -> None:
        """Bring this replica to the shared state's latest version (the store's follower
        calls it on every change it hears of, and once a second)."""
        async with self._lock:
            await self._converge()

    async def _converge(self) -> None:
        assert self._shared is not None
        version, saved, keys_version = await self._shared.load(self._keys_version)
        if keys_version is not None and version >= self._version:
            # Before the version's own check: a fresh store's keys are read at version 0.
            self._converge_keys(saved.keys, announce=self._keys_version >= 0)
            self._keys_version = keys_version
        if version == self._version:
            return
        if version < self._version:
            # Redis lost its data (restarted without persistence, or flushed): keep what the
            # fleet last agreed on rather than fall back to the config file's defaults.
            log.error(
                "%s went back from version %d to %d: keeping the last state until a newer write",
                self._shared.where, self._version, version,
            )  # fmt: skip
            return
        self._converge_units(saved)
        self._version = version
        for listener in self._on_version:
            listener(version)

    def on_version(self, listener: Callable[[int], None]) -> None:
        """`listener(version)` once this replica is in a newer shared state version."""
        self._on_version.append(listener)

    @property
    def shared(self) -> SharedStore | None:
        return self._shared

    def _converge_units(self, saved: Saved) -> None:
        """The registry made equal to `saved` over the config file: units removed and added
        elsewhere, then every unit's admin state (the config's own where nothing overrides)."""
        for unit_id in list(self.units.units):
            added_here = unit_id not in self._configured
            if unit_id in saved.removed or (added_here and unit_id not in saved.added):
                self.units.remove(unit_id)
                del self.marks[unit_id]
                self.events.record(
                    unit_id, "remove", "through the shared state", "fleet", echo=True
                )
        for unit_id, added in saved.added.items():
            if unit_id not in self.units.units:
                try:
                    config = self.parse_unit(added.config)
                except AdminError as exc:
                    log.error("shared unit %s cannot be added here: %s", unit_id, exc)
                    continue
                self._add(config, added)
                reason = f"leader {config.leader}"
                self.events.record(unit_id, "add", reason, added.who, echo=True)
        for unit_id, unit in self.units.units.items():
            mark = saved.marks.get(unit_id) or _initial(unit.config, self._clock())
            if self.marks[unit_id].state != mark.state:
                self._apply(unit, mark)
                self.events.record(unit_id, VERBS[mark.state], mark.reason, mark.who, echo=True)

    def _converge_keys(self, keys: dict[str, Key], announce: bool) -> None:
        """The key table made equal to the shared one; each key made or revoked since the
        last read is recorded (its event is already in the shared log). The first read
        (`announce` False) records none: those keys are not news."""
        before = self.keys.by_id
        self.keys.replace(keys.values())
        for key in keys.values() if announce else ():
            old = before.get(key.id)
            if old is None:
                self.events.record(
                    key.id, "key created", f"tenant {key.tenant}", key.who, echo=True
                )
            if key.revoked is not None and (old is None or old.revoked is None):
                reason = f"tenant {key.tenant}"
                self.events.record(key.id, "key revoked", reason, key.revoked_by, echo=True)

    def _restore_removed(self, saved: Saved) -> None:
        for unit_id, removal in saved.removed.items():
            if unit_id in self.units.units:
                self.units.remove(unit_id)
                del self.marks[unit_id]
                self.events.record(unit_id, "restored", "removed", removal.who)

    def _restore_added(self, saved: Saved, store: Store) -> None:
        for unit_id, added in saved.added.items():
            if unit_id in self.units.units:
                log.warning("unit %s is in the config file now: not re-adding it", unit_id)
                continue
            try:
                config = self.parse_unit(added.config)
            except AdminError as exc:
                message = f"[admin].state_file {store.path}: saved unit {unit_id}: {exc}"
                raise AdminStartError(message) from None
            self._add(config, added)
            self.events.record(unit_id, "restored", f"added, leader {config.leader}", added.who)

    def _restore_marks(self, saved: Saved) -> None:
        for unit_id, mark in saved.marks.items():
            unit = self.units.units.get(unit_id)
            if unit is None:
                continue  # removed from the config file since: nothing to apply it to
            self._apply(unit, mark)
            reason = f"{mark.state}: {mark.reason}" if mark.reason else mark.state
            self.events.record(unit_id, "restored", reason, mark.who)

    def _add(self, config: UnitConfig, added: AddedUnit) -> UnitState:
        unit = self.units.add(config)
        self.marks[config.id] = _initial(config, added.since, added.who)
        return unit

    def _apply(self, unit: UnitState, mark: Mark) -> None:
        """Set both bits, taking the unit out of service first so no step in between admits."""
        enabled, draining = BITS[mark.state]
        steps: list[tuple[Bit, bool]] = [("enabled", enabled), ("draining", draining)]
        steps.sort(key=lambda step: not _closes(*step))
        for bit, value in steps:
            self.units.set_bit(unit.id, bit, value, mark.reason, mark.who)
        self.marks[unit.id] = mark


def _closes(bit: Bit, value: bool) -> bool:
    return value if bit == "draining" else not value


def _initial(config: UnitConfig, since: float, who: str = "config") -> Mark:
    if config.enabled:
        return Mark("enabled", "", who, since)
    reason = "disabled in the config file" if who == "config" else "added with enabled = false"
    return Mark("disabled", reason, who, since)


def _is_default(unit: UnitState, mark: Mark) -> bool:
    """A mark equal to the unit's configured state need not be saved."""
    return mark.state == ("enabled" if unit.config.enabled else "disabled")
