"""The rollout driver: one rollout at a time, cell by cell, step by step, back on a failed gate.

A rollout's life, for each of its cells in order:
1. *prepare*: the `prepare` hooks run, then the new revision's units in the cell must exist
   and be ready (healthy, admitting, in service) within `ready_timeout`; the golden prompts
   are asked of both revisions before any traffic moves.
2. *steps*: the cell gives the new revision each step's share of its conversations. The hard
   guards (error and break rates over the cell so far, a new unit ejected by its breaker) are
   judged every tick and roll back within one; at a step's end the golden prompts are asked
   again and the step's gates are judged on the step's own samples. A gate short of samples
   waits up to `WAIT_STEPS` more step lengths, then the rollout pauses and says why.
3. *retire*: at 100% passed, the cell's old units are drained (their answers run to their
   end), the `retire` hooks run, and the next cell begins.
When every cell has moved the cells serve the new revision and the `done` hooks run. A failed
gate, a failed prepare hook, units not ready in time, or an operator's abort roll back at once:
the canary is removed (every cell serves the old revision), the old units this rollout drained
are enabled again, the `rollback` hooks run, and the reason names the gate and its figures.

The record (record.py) is saved at every change; a gateway restarted mid-rollout carries on
from the same cell and step with a fresh step window.

With replicas sharing Redis (`share`), the record lives in the shared store and exactly one
process drives: the one holding the rollout's lease (gateway/admin/shared_rollouts.py), which
it renews every tick. Every other replica follows: it applies the record's split as each
write is announced, sends its own samples for the driver to add to its own, and passes an
operator's pause, resume or abort to the driver. When the driver dies its lease expires after
`[state].replica_ttl`, and the first replica to look takes it and carries on from the same
step: the step keeps its start and its samples (the dead driver's last ones included), so no
step is run twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

import aiohttp

from gateway.config import Config
from gateway.observability.events import EventLog
from gateway.revisions import Canary, Revisions
from gateway.rollout.collector import Samples, Windows, add_wires
from gateway.rollout.gates import Outcome, Verdict, guards, overall, step_gates
from gateway.rollout.golden import run_golden
from gateway.rollout.hooks import hook_context, run_hook
from gateway.rollout.record import Record, verdict_json
from gateway.rollout.samples import Window
from gateway.rollout.spec import Fleet, Spec, SpecError, parse
from gateway.units import UnitRegistry, UnitState

log = logging.getLogger("unitgate.rollout")

TICK = 0.25  # seconds between looks at the guards and the step's clock
LOOK_EVERY = 0.5  # seconds between a following replica's looks at the shared rollout
STEER_SLACK = 2.0  # seconds past the lease's TTL an operator's ask waits for the driver
WAIT_STEPS = 3.0  # step lengths a step's gates wait past its end for samples, then pause
KEPT = 50  # finished rollouts kept in the list (the store keeps every one)


class Failed(Exception):
    """A gate or a prepare step failed: the rollout rolls back with this reason."""

    def __init__(self, reason: str, verdicts: Sequence[Verdict] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.verdicts = list(verdicts)


class LostLease(Exception):
    """Another process drives the shared rollout now: this one stops driving (and does not
    end it)."""


class Marks(Protocol):
    """The admin service: the rollout drains and re-enables units through it, so the
    operator's view, the events and the store see those as any other admin action."""

    async def set_state(self, unit_id: str, state: Any, reason: str, who: str) -> UnitState: ...

    async def busy(self, units: Sequence[UnitState]) -> list[str]:
        """The units with answers in flight (on any replica, where they share state)."""
        ...


class Kept(Protocol):
    """What the store read back holds of rollouts (gateway/admin/state.py's Saved)."""

    @property
    def rollouts(self) -> dict[str, dict[str, Any]]: ...

    @property
    def serving(self) -> dict[str, str]: ...


class Saver(Protocol):
    async def load(self) -> Kept: ...

    async def put_rollout(self, rollout: str, started: float, record: dict[str, Any]) -> None: ...

    async def set_serving(self, serving: dict[str, str]) -> None: ...


class Link(Saver, Protocol):
    """The rollout shared by replicas (gateway/admin/shared_rollouts.py). `load` gives the
    current record only; `put_rollout` and `set_serving` raise LostLease once another
    process holds the lease."""

    replica: str  # this replica's name in the fleet
    instance: str  # this process's, in the lease and the samples
    ttl: float  # seconds the lease lasts unless renewed

    async def history(self) -> list[dict[str, Any]]: ...

    async def acquire(self) -> bool: ...

    async def release(self) -> None: ...

    async def tick(
        self, windows: dict[str, Any] | None
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]: ...

    async def publish(self, windows: dict[str, Any]) -> None: ...

    async def clear_samples(self) -> None: ...

    async def command(self, verb: str, rollout: str, who: str) -> None: ...


class RolloutError(Exception):
    """Refused: `status` 400 (the ask is wrong, `field` names what), 404 or 409."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


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
        self.config = config
        self.settings = config.rollout
        self.units = units
        self.marks = marks
        self.events = events
        self.samples = samples
        self.clock = clock
        self.records: dict[str, Record] = {}  # oldest first
        self.current: Record | None = None
        self._spec: Spec | None = None
        self._store: Saver | None = None
        self._task: asyncio.Task[None] | None = None
        self._golden_done: tuple[int, int] | None = None
        self._lock = asyncio.Lock()
        self.note = ""  # said with every start: what a restart would do to it
        self._link: Link | None = None  # with replicas: the shared rollout
        self._watcher: asyncio.Task[None] | None = None
        self._poked = asyncio.Event()  # the shared state changed: look again
        self._others: dict[str, Any] = {}  # the other processes' windows, by process
        self._renewed = 0.0  # loop time the lease was last renewed
        self._warned: set[tuple[str, str]] = set()

    # -- the operator's side -------------------------------------------------------------

    async def restore(self, store: Saver | None) -> None:
        """The saved rollouts and cells back, before the listeners open; a rollout that was
        live carries on from its cell and step."""
        self._store = store
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
                    await self._end(
                        record, "rolled_back", f"cannot carry on after a restart: {exc}"
                    )
                    continue
                self._begin(record, spec)
                self.events.record(
                    _subject(record),
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
        self._link = self._store = link
        self.note = ""
        try:
            await self._look()
        except Exception as exc:  # Redis away at start: the watcher looks again
            log.warning("the shared rollout cannot be read yet (%s)", exc)
        self._watcher = asyncio.create_task(self._watch(), name="rollout-watch")

    def poke(self) -> None:
        """The shared state changed (a record written somewhere): look now."""
        self._poked.set()

    @property
    def driving(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self, body: object, who: str) -> Record:
        async with self._lock:
            self._refuse_second(self.current)
            link = self._link
            if link is not None:  # the fleet's, not only what this replica has heard
                found = await link.load()
                current = next(iter(found.rollouts.values()), None)
                self._refuse_second(None if current is None else Record.from_wire(current))
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
            self.records[record.id] = record
            if link is not None:  # every replica must hear of it, or it does not start
                try:
                    await link.put_rollout(record.id, record.started, record.wire())
                except Exception:
                    del self.records[record.id]
                    with contextlib.suppress(Exception):
                        await link.release()
                    raise
            else:
                await self._save(record)
            what = f"{spec.old!r} to {spec.to!r} over cells {', '.join(spec.cells)}"
            self.events.record(_subject(record), "rollout started", what, who)
            self._begin(record, spec)
            self._trim()
            return record

    @staticmethod
    def _refuse_second(running: Record | None) -> None:
        if running is not None and running.live:
            raise RolloutError(
                f"rollout {running.id} is {running.state} (cell {running.current_cell}): "
                "one rollout at a time; abort it or wait for its end",
                409,
                "rollout_running",
            )

    async def listing(self) -> list[Record]:
        """Every rollout kept, newest first (with replicas, the fleet's)."""
        if self._link is None:
            return list(reversed(self.records.values()))
        found = [Record.from_wire(wire) for wire in await self._link.history()]
        return found[::-1]

    async def pause(self, who: str) -> Record:
        if self._link is not None and not self.driving:
            return await self._steer_remotely("pause", who)
        record = self._live()
        if record.state == "running":
            record.state, record.reason = "paused", f"paused by {who}"
            async with _moved(record):
                await self._save(record)
            self.events.record(_subject(record), "rollout paused", record.reason, who)
        return record

    async def resume(self, who: str) -> Record:
        if self._link is not None and not self.driving:
            return await self._steer_remotely("resume", who)
        record = self._live()
        if record.state == "paused":
            record.state, record.reason = "running", f"resumed by {who}"
            if record.step >= 0 and self._spec is not None:  # the step starts over
                record.since = self.clock()
                record.epoch += 1  # on fresh samples
                self._apply(record, self._spec)
            async with _moved(record):
                await self._save(record)
            self.events.record(_subject(record), "rollout resumed", record.reason, who)
        return record

    async def abort(self, who: str) -> Record:
        if self._link is not None and not self.driving:
            return await self._steer_remotely("abort", who)
        record = self._live()
        await self._stop_task()
        async with _moved(record):
            await self._end(record, "aborted", f"aborted by {who}", who)
        return record

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

    async def stop(self) -> None:
        """At shutdown: the driver stops where it is; the record says `running`, so a
        restarted gateway with a state file carries on (with replicas, the lease is given
        up, and another replica carries on at once)."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        was_driving = self.driving
        await self._stop_task()
        if self._link is not None and was_driving:
            with contextlib.suppress(Exception):
                await self._link.release()

    # -- with replicas: following the shared rollout -------------------------------------

    async def _watch(self) -> None:
        """Until cancelled: look at the shared rollout on every change and every
        LOOK_EVERY, unless this process drives it (its driver looks every tick)."""
        while True:
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
            self._spec = None
            self.units.set_revisions(Revisions(self.units.revisions.serving))
            return
        try:
            spec = parse(record.spec, self.settings, None)
        except SpecError as exc:
            log.error("rollout %s cannot be followed here: %s", record.id, exc)
            return
        if not await link.acquire():
            self._spec = spec
            self._apply(record, spec)
            return
        step = "waits for its units" if record.step < 0 else f"step {record.step + 1}"
        self.events.record(
            _subject(record),
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

    async def _exchange(self, record: Record) -> None:
        """The driver's look, each tick: lease renewed, samples swapped, operators' asks
        taken. A store out of reach for longer than the lease means another replica may
        drive now: stop."""
        link = self._link
        assert link is not None
        mine = self.samples.windows()
        loop = asyncio.get_running_loop()
        try:
            commands, others = await link.tick(None if mine is None else mine.wire())
        except LostLease:
            raise
        except Exception as exc:
            if loop.time() - self._renewed > link.ttl:
                why = f"the shared store was out of reach past the lease ({exc})"
                raise LostLease(why) from None
            return
        self._renewed = loop.time()
        self._others = {p: w for p, w in others.items() if p != link.instance}
        for ask in commands:
            if ask.get("id") != record.id or not record.live:
                continue
            verb, who = str(ask.get("verb")), str(ask.get("who", "an operator"))
            if verb == "pause":
                await self.pause(who)
            elif verb == "resume":
                await self.resume(who)
            elif verb == "abort":
                await self._end(record, "aborted", f"aborted by {who}", who)

    def _live(self) -> Record:
        record = self.current
        if record is None or not record.live:
            raise RolloutError("no rollout is running", 404, "no_rollout")
        return record

    def _fleet(self) -> Fleet:
        carried: dict[str, set[str]] = {}
        for unit in self.units.units.values():
            carried.setdefault(unit.cell, set()).add(unit.revision)
        return Fleet(
            dict(self.units.revisions.serving),
            {cell: frozenset(r) for cell, r in carried.items()},
        )

    def _begin(self, record: Record, spec: Spec, fresh: bool = True) -> None:
        """Drive `record` from where it is. `fresh`: what was collected before (a restart)
        is gone, so the step's samples start over; a replica taking over keeps them."""
        self.current, self._spec = record, spec
        if fresh:
            record.epoch += 1
        self._golden_done = None
        self._renewed = asyncio.get_running_loop().time()
        self._apply(record, spec)
        self._task = asyncio.create_task(self._drive(record, spec), name=f"rollout-{record.id}")

    def _trim(self) -> None:
        done = [r for r in self.records.values() if not r.live]
        for record in done[: max(0, len(done) - KEPT)]:
            del self.records[record.id]

    async def _stop_task(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the driver ------------------------------------------------------------------------

    async def _drive(self, record: Record, spec: Spec) -> None:
        try:
            await self._driven(record, spec)
        except LostLease as exc:  # the successor carries on: nothing is ended here
            log.warning("rollout %s: no longer driven here (%s)", record.id, exc)
            self._others = {}

    async def _driven(self, record: Record, spec: Spec) -> None:
        try:
            async with aiohttp.ClientSession() as session:
                while record.live:
                    if self._link is not None:
                        await self._exchange(record)
                    if record.live:
                        await self._tick(record, spec, session)
                    if record.live:
                        await asyncio.sleep(TICK)
        except Failed as failure:
            if failure.verdicts:
                record.gates = [verdict_json(v) for v in failure.verdicts]
            await self._end(record, "rolled_back", failure.reason)
        except (asyncio.CancelledError, LostLease):
            raise
        except Exception as exc:  # a bug must not leave the fleet half moved
            log.exception("rollout %s: the driver failed", record.id)
            await self._end(record, "rolled_back", f"the rollout's driver failed: {exc!r}")

    async def _tick(self, record: Record, spec: Spec, session: aiohttp.ClientSession) -> None:
        now = self.clock()
        if record.step >= 0 or record.state == "paused":
            self._guard(record, spec)
        if record.state == "paused":
            return
        if record.step < 0:
            await self._prepare(record, spec, session, now)
        elif now - record.since >= spec.step_seconds:
            await self._judge(record, spec, session, now)

    def _guard(self, record: Record, spec: Spec) -> None:
        """The hard guards, on the cell's samples so far: they roll back within a tick."""
        cell = spec.cells[record.cell]
        for unit in self._new_units(spec, cells=spec.cells[: record.cell + 1]):
            if not unit.admitting:
                why = unit.reasons.get("admitting", "")
                raise Failed(
                    f"unit {unit.id} of revision {spec.to!r} (cell {unit.cell}) was "
                    f"ejected by its breaker ({why})"
                )
        cell_so_far = self._windows().cell
        verdicts = guards(cell_so_far.new, cell_so_far.old, spec.gates)
        failed = [v for v in verdicts if v.outcome == "fail"]
        if failed:
            raise Failed(f"guard in cell {cell}: {failed[0].reason}", verdicts)

    async def _prepare(
        self, record: Record, spec: Spec, session: aiohttp.ClientSession, now: float
    ) -> None:
        cell = spec.cells[record.cell]
        if record.prepared < record.cell:
            await self._hooks(record, spec, "prepare", cell, fail=True)
            record.prepared, record.since = record.cell, self.clock()
            await self._save(record)
            return
        units = [u for u in self._new_units(spec, cells=(cell,)) if u.in_service]
        if not units or not all(u.health.routable and u.admitting for u in units):
            if now - record.since > spec.ready_timeout:
                have = ", ".join(f"{u.id} ({u.health.value})" for u in units) or "none"
                raise Failed(
                    f"cell {cell}: the units of revision {spec.to!r} were not ready "
                    f"within {spec.ready_timeout:g} s (units: {have})"
                )
            return
        await self._golden(record, spec, session, cell)
        await self._next_step(record, spec, 0)

    async def _judge(
        self, record: Record, spec: Spec, session: aiohttp.ClientSession, now: float
    ) -> None:
        """At a step's end: the golden prompts once, then the step's gates."""
        cell = spec.cells[record.cell]
        if self._golden_done != (record.cell, record.step) and self.settings.golden_every_step:
            await self._golden(record, spec, session, cell)
            self._golden_done = (record.cell, record.step)
        look = record.cell * len(spec.steps) + record.step + 1
        windows = self._windows()
        old, latency = self._baseline(record, spec, windows)
        verdicts = step_gates(windows.step.new, old, spec.gates, look, spec.looks)
        if not latency:
            verdicts = [_uncompared(v) if v.gate in LATENCY_GATES else v for v in verdicts]
        record.gates = [verdict_json(v) for v in verdicts]
        outcome = overall(verdicts)
        if outcome == "fail":
            failed = next(v for v in verdicts if v.outcome == "fail")
            raise Failed(
                f"gate {failed.gate} in cell {cell} at {spec.steps[record.step]}%: {failed.reason}",
                verdicts,
            )
        if outcome == "wait":
            if now - record.since > spec.step_seconds * (1 + WAIT_STEPS):
                waiting = next(v for v in verdicts if v.outcome == "wait")
                record.state = "paused"
                record.reason = (
                    f"gate {waiting.gate} still waits for samples "
                    f"{WAIT_STEPS:g} step lengths after the step's end: "
                    f"{waiting.reason}; resume to wait longer, abort to roll back"
                )
                await self._save(record)
                self.events.record(
                    _subject(record), "rollout paused", record.reason, "rollout", logging.WARNING
                )
            return
        self.events.record(
            _subject(record),
            "rollout verdict",
            f"cell {cell} at {spec.steps[record.step]}%: every gate passed",
            "rollout",
        )
        if record.step + 1 < len(spec.steps):
            await self._next_step(record, spec, record.step + 1)
        else:
            await self._retire(record, spec, cell)

    async def _next_step(self, record: Record, spec: Spec, step: int) -> None:
        record.step, record.share = step, spec.steps[step] / 100
        record.since = self.clock()
        record.epoch += 1
        self._apply(record, spec)
        await self._save(record)
        cell = spec.cells[record.cell]
        self.events.record(
            _subject(record),
            "rollout step",
            f"cell {cell}: {spec.steps[step]}% of its conversations on {spec.to!r}",
            "rollout",
        )

    async def _retire(self, record: Record, spec: Spec, cell: str) -> None:
        """The cell moved: its old units drained (answers in flight run to their end, the
        guards judged meanwhile), the retire hooks told, and the next cell begun (or the
        rollout done)."""
        old = [
            u
            for u in self.units.units.values()
            if u.cell == cell and u.revision == spec.old and u.in_service
        ]
        who = f"rollout {record.id}"
        for unit in old:
            await self.marks.set_state(
                unit.id, "draining", f"cell {cell} moved to {spec.to!r}", who
            )
            record.drained.append(unit.id)
        await self._save(record)
        await self._drained(record, spec, old)
        await self._hooks(record, spec, "retire", cell, fail=False, old=[u.id for u in old])
        record.cell += 1
        record.step, record.share, record.since = -1, 0.0, self.clock()
        record.epoch += 1
        self._apply(record, spec)
        await self._save(record)
        self.events.record(
            _subject(record),
            "rollout cell done",
            f"cell {cell} serves {spec.to!r}; its old units are drained",
            "rollout",
        )
        if record.cell >= len(spec.cells):
            await self._succeed(record, spec)

    async def _drained(self, record: Record, spec: Spec, units: Sequence[UnitState]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeouts.total
        while busy := await self.marks.busy(units):
            self._guard(record, spec)
            if loop.time() > deadline:
                log.warning(
                    "units %s still have answers in flight after the total timeout",
                    ", ".join(busy),
                )
                return
            await asyncio.sleep(TICK)
            if self._link is not None:
                await self._exchange(record)

    async def _succeed(self, record: Record, spec: Spec) -> None:
        revisions = self.units.revisions
        for cell in spec.cells:
            revisions = revisions.with_serving(cell, spec.to)
        self.units.set_revisions(Revisions(revisions.serving))
        if self._store is not None:
            await self._store.set_serving(dict(revisions.serving))
        record.state, record.ended = "succeeded", self.clock()
        record.reason = f"every cell serves {spec.to!r}"
        await self._save(record)
        await self._let_go()
        self.events.record(_subject(record), "rollout succeeded", record.reason, "rollout")
        await self._hooks(record, spec, "done", None, fail=False)

    async def _end(self, record: Record, state: str, reason: str, who: str = "rollout") -> None:
        """Rolled back or aborted: the old revision everywhere again, at once."""
        spec = self._spec
        self.units.set_revisions(Revisions(self.units.revisions.serving))
        record.state = "aborted" if state == "aborted" else "rolled_back"
        record.reason, record.ended = reason, self.clock()
        for unit_id in record.drained:
            if unit_id in self.units.units:
                await self.marks.set_state(
                    unit_id, "enabled", f"rollout {record.id} rolled back", f"rollout {record.id}"
                )
        await self._save(record)
        await self._let_go()
        self.events.record(
            _subject(record),
            f"rollout {record.state.replace('_', ' ')}",
            reason,
            who,
            logging.WARNING,
        )
        if spec is not None and spec.hooks:
            await self._hooks(record, spec, "rollback", None, fail=False)

    # -- helpers -----------------------------------------------------------------------------

    async def _let_go(self) -> None:
        """The rollout ended: with replicas, its samples dropped and its lease given up."""
        link = self._link
        if link is None:
            return
        self._others = {}
        try:
            await link.clear_samples()
            await link.release()
        except Exception as exc:  # the lease expires by itself; the samples within a day
            log.warning("the ended rollout's lease and samples were not cleared: %s", exc)

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

    def _apply(self, record: Record, spec: Spec) -> None:
        """The record's split, as routing applies it."""
        if not record.live:
            return
        cells = spec.cells
        canary = Canary(
            id=record.id,
            old=spec.old,
            new=spec.to,
            cells=frozenset(cells),
            moved=frozenset(cells[: record.cell]),
            cell=cells[record.cell] if record.step >= 0 and record.cell < len(cells) else None,
            share=record.share,
            resume_across=spec.resume_across,
            epoch=record.epoch,
        )
        self.units.set_revisions(Revisions(self.units.revisions.serving, canary))

    @staticmethod
    def _baseline(record: Record, spec: Spec, windows: Windows) -> tuple[Window, bool]:
        """What the new revision's answers in the cell are judged against, and whether its
        latency is (like with like: never old units carrying less load each than the new
        ones do). Up to 50%, the cell's own old units (they carry more). Above, the old
        units of the cells not yet moved, each carrying its whole cell as the new ones do
        theirs; in the last cell, none is left: the step before stands in for errors, breaks
        and finish reasons, and latency is not compared."""
        if record.share <= 0.5:
            return windows.step.old, True
        if windows.others.old.requests >= spec.gates.min_samples:
            return windows.others.old, True
        return windows.before.old, False

    def _windows(self) -> Windows:
        """The current split's samples (empty ones until an answer came)."""
        found = self.samples.windows()
        if found is None:
            return _EMPTY
        if not self._others:
            return found
        summed = Windows(found.key, found.old, found.new)
        return add_wires(summed, [found.wire(), *self._others.values()])

    def _new_units(self, spec: Spec, cells: Sequence[str]) -> list[UnitState]:
        return [u for u in self.units.units.values() if u.cell in cells and u.revision == spec.to]

    async def _golden(
        self, record: Record, spec: Spec, session: aiohttp.ClientSession, cell: str
    ) -> None:
        if not spec.golden:
            return
        new = [u for u in self._new_units(spec, (cell,)) if u.routable]
        old = [u for u in self.units.units.values() if u.revision == spec.old and u.routable]
        old.sort(key=lambda u: u.cell != cell)  # the same cell's first
        if not new or not old:
            raise Failed(
                f"cell {cell}: no routable unit of {'the new' if not new else 'the old'}"
                " revision to ask the golden prompts"
            )
        results = await run_golden(
            spec.golden, old[0], new[0], session, within=self.config.timeouts.total
        )
        failed = [r for r in results if not r.passed and not r.inconclusive]
        figures: dict[str, float | int] = {"items": len(results), "failed": len(failed)}
        outcome: Outcome = "fail" if failed else "pass"
        reason = failed[0].reason if failed else f"{len(results)} golden prompts answered alike"
        verdict = Verdict("golden", outcome, figures, reason)
        record.gates = [verdict_json(verdict)]
        if failed:
            raise Failed(
                f"gate golden in cell {cell}: {reason} (units {old[0].id} and {new[0].id})",
                [verdict],
            )

    async def _hooks(
        self,
        record: Record,
        spec: Spec,
        moment: str,
        cell: str | None,
        fail: bool,
        old: Sequence[str] = (),
    ) -> None:
        for name in spec.hooks:
            hook = self.settings.hooks[name]
            if not hook.serves(moment):
                continue
            cells = spec.cells if cell is None else (cell,)
            context = hook_context(
                record.id,
                moment,
                cell or "",
                spec.old,
                spec.to,
                list(old)
                or [u.id for u in self.units.units.values()
                    if u.cell in cells and u.revision == spec.old],
                [u.id for u in self._new_units(spec, cells)],
            )  # fmt: skip
            result = await run_hook(hook, moment, context)
            level = logging.INFO if result.ok else logging.WARNING
            self.events.record(
                _subject(record),
                f"rollout hook {name}",
                f"{moment}: {result.detail}",
                "rollout",
                level,
            )
            if fail and not result.ok:
                raise Failed(f"{moment} hook {name} failed: {result.detail}")

    async def _save(self, record: Record) -> None:
        if self._store is None:
            return
        try:
            await self._store.put_rollout(record.id, record.started, record.wire())
        except LostLease:
            raise
        except Exception as exc:
            log.warning(
                "rollout %s: cannot save its state (%s): a restart would lose it", record.id, exc
            )


_EMPTY = Windows(("", 0, 0), "", "")
LATENCY_GATES = frozenset({"ttft", "tpot"})


def _uncompared(verdict: Verdict) -> Verdict:
    return Verdict(
        verdict.gate,
        "pass",
        {},
        "not compared: no old unit carries the load the new ones do (the last cell above 50%)",
    )


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


def _subject(record: Record) -> str:
    return f"rollout:{record.id}"
