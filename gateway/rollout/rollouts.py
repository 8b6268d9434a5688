"""Rollouts as an operator sees them: one at a time, started, steered and shown through the
admin API, kept over restarts, and shared by replicas.

The driving itself is driver.py's: this keeps the records, starts a `Driver` for a live one
(at a start, or a restart that finds one in the state file), and answers pause, resume, abort,
the current rollout, the list and the verdict.

With replicas sharing Redis (`share`), the record lives in the shared store and exactly one
process drives: the one holding the rollout's lease (gateway/admin/shared_rollouts.py). Every
other replica follows: it applies the record's split as each write is announced, sends its own
samples for the driver to add to its own, and passes an operator's pause, resume or abort to
the driver. When the driver dies its lease expires after `[state].replica_ttl`, and the first
replica to look takes it and carries on from the same step: the step keeps its start and its
samples (the dead driver's last ones included), so no step runs twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from gateway.base.tasks import end
from gateway.config import Config
from gateway.observability.events import EventLog
from gateway.revisions import Revisions
from gateway.rollout.collector import Samples
from gateway.rollout.driver import TICK, Driver, Parts, apply, save, subject
from gateway.rollout.ports import Link, LostLease, Marks, RolloutError, Saver
from gateway.rollout.record import Record
from gateway.rollout.spec import Fleet, Spec, SpecError, parse
from gateway.units import UnitRegistry

log = logging.getLogger("unitgate.rollout")

LOOK_EVERY = 0.5  # seconds between a following replica's looks at the shared rollout
STEER_SLACK = 2.0  # seconds past the lease's TTL an operator's ask waits for the driver
KEPT = 50  # finished rollouts kept in the list (the store keeps every one)
STOP_WITHIN_S = 0.5  # for the watcher and the driver to end at shutdown


class Rollouts:
    def __init__(
        self,
        config: Config,
        units: UnitRegistry,
        marks: Marks,
        events: EventLog,
        samples: Samples,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = config.rollout
        self.units = units
        self.events = events
        self.samples = samples
        self.clock = clock
        self._parts = Parts(config, units, marks, events, samples, None, None, clock)
        self.records: dict[str, Record] = {}  # oldest first
        self.current: Record | None = None
        self._driver: Driver | None = None
        self._lock = asyncio.Lock()
        self.note = ""  # said with every start: what a restart would do to it
        self._watcher: asyncio.Task[None] | None = None
        self._poked = asyncio.Event()  # the shared state changed: look again
        self._warned: set[tuple[str, str]] = set()
        self._stopping = False

    @property
    def _link(self) -> Link | None:
        return self._parts.link

    @property
    def driving(self) -> bool:
        return self._driver is not None and self._driver.running

    # -- kept over restarts, shared by replicas ----------------------------------------------

    async def restore(self, store: Saver | None) -> None:
        """The saved rollouts and cells back, before the listeners open; a rollout that was
        live carries on from its cell and step, on fresh samples."""
        self._parts = dataclasses.replace(self._parts, store=store)
        saved: Mapping[str, dict[str, Any]] = {}
        serving: Mapping[str, str] = {}
        if store is not None:
            found = await store.load()
            saved, serving = found.rollouts, found.serving
        if store is None:
            self.note = (
                "[admin].state_file is empty: a restart of the gateway ends this rollout "
                "rolled back (the cells serve their configured revision again)"
            )
        self._serve(serving)
        for rollout, wire in saved.items():
            try:
                record = Record.from_wire(wire)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning(
                    "rollout %s in the state file is unreadable (%s): skipped", rollout, exc
                )
                continue
            self.records[record.id] = record
            if record.live:
                try:
                    spec = parse(record.spec, self.settings, None)
                except SpecError as exc:
                    await self._abandon(record, f"cannot carry on after a restart: {exc}")
                    continue
                self._begin(record, spec)
                self.events.record(
                    subject(record),
                    "rollout restored",
                    f"carries on at cell {record.current_cell}, step {record.step + 1}",
                    "system",
                )
        if self.current is None and self.records:
            self.current = list(self.records.values())[-1]  # the last one, ended
        self._trim()

    async def share(self, link: Link) -> None:
        """With replicas sharing Redis, instead of `restore`: the rollout is read from the
        shared store and followed until `stop`; a live one whose driver is gone is taken
        over (here, or by another replica)."""
        self._parts = dataclasses.replace(self._parts, store=link, link=link)
        self.note = ""
        try:
            await self._look()
        except Exception as exc:  # Redis away at start: the watcher looks again
            log.warning("the shared rollout cannot be read yet (%s)", exc)
        self._watcher = asyncio.create_task(self._watch(), name="rollout-watch")

    def poke(self) -> None:
        """The shared state changed (a record written somewhere): look now."""
        self._poked.set()

    async def stop(self) -> None:
        """At shutdown: the driver stops where it is; the record says `running`, so a
        restarted gateway with a state file carries on (with replicas, the lease is given
        up, and another replica carries on at once)."""
        self._stopping = True  # a watcher that swallowed its cancellation ends at its next look
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            await end(watcher, within=STOP_WITHIN_S, log=log)
        was_driving = self.driving
        if self._driver is not None:
            await self._driver.stop()
        if self._link is not None and was_driving:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(STOP_WITHIN_S):
                    await self._link.release()

    # -- the operator's side -------------------------------------------------------------

    async def start(self, body: object, who: str) -> Record:
        async with self._lock:
            _refuse_second(self.current)
            link = self._link
            if link is not None:  # the fleet's, not only what this replica has heard
                found = await link.load()
                current = next(iter(found.rollouts.values()), None)
                _refuse_second(None if current is None else Record.from_wire(current))
            try:
                spec = parse(body, self.settings, self._fleet())
            except SpecError as exc:
                raise RolloutError(str(exc), 400, "invalid_rollout") from None
            if link is not None and not await link.acquire():
                raise RolloutError(
                    "another replica is starting or driving a rollout: one at a time",
                    409,
                    "rollout_running",
                )
            now = self.clock()
            record = Record(
                id=f"r-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{secrets.token_hex(2)}",
                spec=spec.wire(),
                who=who,
                started=now,
                since=now,
            )
            store = self._parts.store
            if link is not None:  # every replica must hear of it, or it does not start
                try:
                    await link.put_rollout(record.id, record.started, record.wire())
                except Exception:
                    with contextlib.suppress(Exception):
                        await link.release()
                    raise
            else:
                await save(store, record)
            self.records[record.id] = record
            what = f"{spec.old!r} to {spec.to!r} over cells {', '.join(spec.cells)}"
            self.events.record(subject(record), "rollout started", what, who)
            self._begin(record, spec)
            self._trim()
            return record

    async def pause(self, who: str) -> Record:
        return await self._steer("pause", who, lambda driver: driver.pause(who))

    async def resume(self, who: str) -> Record:
        return await self._steer("resume", who, lambda driver: driver.resume(who))

    async def abort(self, who: str) -> Record:
        return await self._steer("abort", who, lambda driver: _abort(driver, who))

    async def _steer(self, verb: str, who: str, act: Callable[[Driver], Awaitable[None]]) -> Record:
        """An operator's ask: acted on here by this process's driver, or passed to the
        replica that drives the rollout."""
        if self._link is not None and not self.driving:
            return await self._steer_remotely(verb, who)
        record, driver = self._driven()
        async with _moved(record):
            await act(driver)
        return record

    async def listing(self) -> list[Record]:
        """Every rollout kept, newest first (with replicas, the fleet's)."""
        if self._link is None:
            return list(reversed(self.records.values()))
        found = [Record.from_wire(wire) for wire in await self._link.history()]
        return found[::-1]

    def view(self) -> dict[str, Any] | None:
        """The current (or last) rollout as the admin API shows it; None: none has run."""
        return None if self.current is None else self.current.view()

    def verdict(self) -> dict[str, Any]:
        """For another tool's analysis (Argo Rollouts' web metric, a Flagger webhook):
        "fail" once rolled back or a gate failed, "pass" once succeeded or every gate of the
        last look passed, else "wait"."""
        record = self.current
        if record is None:
            raise RolloutError("no rollout has run yet", 404, "no_rollout")
        if record.state in ("rolled_back", "aborted"):
            outcome = "fail"
        elif record.state == "succeeded":
            outcome = "pass"
        else:
            outcomes = {g["outcome"] for g in record.gates}
            outcome = "fail" if "fail" in outcomes else "pass" if outcomes == {"pass"} else "wait"
        return {
            "id": record.id,
            "state": record.state,
            "verdict": outcome,
            "gates": record.gates,
            "reason": record.reason,
        }

    # -- with replicas: following the shared rollout -------------------------------------

    async def _watch(self) -> None:
        """Until cancelled: look at the shared rollout on every change and every
        LOOK_EVERY, unless this process drives it (its driver looks every tick)."""
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poked.wait(), LOOK_EVERY)
            self._poked.clear()
            if self.driving:
                continue
            try:
                await self._look()
            except Exception as exc:  # the store's follower logs its outages
                log.debug("the shared rollout not read: %s", exc)

    async def _look(self) -> None:
        """Send this replica's samples; apply what the shared store says; take a live
        rollout over if nobody holds its lease."""
        link = self._link
        assert link is not None
        mine = self.samples.windows()
        if mine is not None:
            await link.publish(mine.wire())
        found = await link.load()
        self._serve(found.serving)
        wire = next(iter(found.rollouts.values()), None)
        if wire is None or self.driving:
            return
        record = Record.from_wire(wire)
        self.records[record.id] = record
        self.current = record
        self._trim()
        if not record.live:
            self.units.set_revisions(Revisions(self.units.revisions.serving))
            return
        try:
            spec = parse(record.spec, self.settings, None)
        except SpecError as exc:
            log.error("rollout %s cannot be followed here: %s", record.id, exc)
            return
        if not await link.acquire():
            apply(self.units, record, spec)
            return
        step = "waits for its units" if record.step < 0 else f"step {record.step + 1}"
        self.events.record(
            subject(record),
            "rollout taken over",
            f"replica {link.replica} carries on: cell {record.current_cell}, {step}",
            "rollout",
        )
        self._begin(record, spec, fresh=False)

    async def _steer_remotely(self, verb: str, who: str) -> Record:
        """Pause, resume or abort asked of a replica that does not drive: passed to the
        driver, answered once the shared record shows it done (the driver acts within a
        tick; a dead driver's successor within the lease's TTL)."""
        link = self._link
        assert link is not None
        record = self._live()
        await link.command(verb, record.id, who)
        loop = asyncio.get_running_loop()
        within = link.ttl + LOOK_EVERY + STEER_SLACK
        deadline = loop.time() + within
        while loop.time() < deadline:
            self.poke()
            await asyncio.sleep(TICK / 2)
            current = self.current
            if current is not None and current.id == record.id and _steered(verb, current):
                return current
        raise RolloutError(
            f"rollout {record.id}: the replica driving it did not {verb} it within "
            f"{within:g} s; the ask stays queued for its driver",
            503,
            "rollout_driver_unavailable",
        )

    # -- helpers -----------------------------------------------------------------------------

    def _begin(self, record: Record, spec: Spec, fresh: bool = True) -> None:
        """Drive `record` from where it is. `fresh`: what was collected before (a restart)
        is gone, so the step's samples start over; a replica taking over keeps them."""
        if fresh:
            record.epoch += 1
        self.current = record
        self._driver = Driver(self._parts, record, spec)
        self._driver.start()

    def _live(self) -> Record:
        record = self.current
        if record is None or not record.live:
            raise RolloutError("no rollout is running", 404, "no_rollout")
        return record

    def _driven(self) -> tuple[Record, Driver]:
        record, driver = self._live(), self._driver
        if driver is None or driver.record is not record:
            raise RolloutError(
                f"rollout {record.id} has no driver here", 503, "rollout_driver_unavailable"
            )
        return record, driver

    async def _abandon(self, record: Record, reason: str) -> None:
        """A live record this gateway cannot drive (its ask no longer parses): ended rolled
        back where it stands, the units it drained enabled again."""
        record.state, record.reason, record.ended = "rolled_back", reason, self.clock()
        for unit_id in record.drained:
            if unit_id in self.units.units:
                await self._parts.marks.set_state(
                    unit_id, "enabled", f"rollout {record.id} rolled back", f"rollout {record.id}"
                )
        await save(self._parts.store, record)
        self.events.record(
            subject(record), "rollout rolled back", reason, "rollout", logging.WARNING
        )

    def _fleet(self) -> Fleet:
        carried: dict[str, set[str]] = {}
        for unit in self.units.units.values():
            carried.setdefault(unit.cell, set()).add(unit.revision)
        return Fleet(
            dict(self.units.revisions.serving),
            {cell: frozenset(r) for cell, r in carried.items()},
        )

    def _serve(self, serving: Mapping[str, str]) -> None:
        """The cells' revisions as the last rollout left them, where their units exist."""
        revisions = self.units.revisions
        for cell, revision in serving.items():
            if any(u.cell == cell and u.revision == revision for u in self.units.units.values()):
                revisions = revisions.with_serving(cell, revision)
            elif (cell, revision) not in self._warned:
                self._warned.add((cell, revision))
                log.warning(
                    "cell %s served revision %r after the last rollout, but no unit of it is "
                    "configured or added now: it serves %r",
                    cell,
                    revision,
                    revisions.of(cell),
                )
        self.units.set_revisions(revisions)

    def _trim(self) -> None:
        done = [r for r in self.records.values() if not r.live]
        for record in done[: max(0, len(done) - KEPT)]:
            del self.records[record.id]


def _refuse_second(running: Record | None) -> None:
    if running is not None and running.live:
        raise RolloutError(
            f"rollout {running.id} is {running.state} (cell {running.current_cell}): "
            "one rollout at a time; abort it or wait for its end",
            409,
            "rollout_running",
        )


async def _abort(driver: Driver, who: str) -> None:
    await driver.stop()
    await driver.end("aborted", f"aborted by {who}", who)


@contextlib.asynccontextmanager
async def _moved(record: Record) -> AsyncIterator[None]:
    """An operator's ask met a lost lease: another replica drives the rollout now."""
    try:
        yield
    except LostLease:
        raise RolloutError(
            f"rollout {record.id}: another replica drives it now; ask again",
            503,
            "rollout_driver_unavailable",
        ) from None


def _steered(verb: str, record: Record) -> bool:
    """Whether `record` shows an operator's `verb` done (or the rollout over anyway)."""
    if not record.live:
        return True
    return {"pause": "paused", "resume": "running"}.get(verb) == record.state
