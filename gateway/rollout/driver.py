"""The rollout driver: one rollout, cell by cell, step by step, back on a failed gate.

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
   end on every replica), the `retire` hooks run, and the next cell begins.
When every cell has moved the cells serve the new revision and the `done` hooks run. A failed
gate, a failed prepare hook, units not ready in time, or an operator's abort roll back at once:
the canary is removed (every cell serves the old revision), the old units this rollout drained
are enabled again, the `rollback` hooks run, and the reason names the gate and its figures.

The record (record.py) is saved at every change. With replicas sharing Redis the driver is the
process holding the rollout's lease: every tick it renews the lease, takes the operators' asks
passed on by other replicas, and swaps samples with them (its gates judge the whole fleet's
answers). A write refused for a lost lease stops the driver without ending the rollout: its
successor carries on (rollouts.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from gateway.base.tasks import end
from gateway.config import Config
from gateway.observability.events import EventLog
from gateway.revisions import Canary, Revisions
from gateway.rollout.collector import Samples, Windows, add_wires
from gateway.rollout.gates import Outcome, Verdict, guards, overall, step_gates
from gateway.rollout.golden import run_golden
from gateway.rollout.hooks import hook_context, run_hook
from gateway.rollout.ports import Link, LostLease, Marks, Saver
from gateway.rollout.record import Record, verdict_json
from gateway.rollout.samples import Window
from gateway.rollout.spec import Spec
from gateway.units import UnitRegistry, UnitState

log = logging.getLogger("unitgate.rollout")

TICK = 0.25  # seconds between looks at the guards and the step's clock
WAIT_STEPS = 3.0  # step lengths a step's gates wait past its end for samples, then pause
STOP_WITHIN_S = 0.5  # for the driving task to end when stopped


class Failed(Exception):
    """A gate or a prepare step failed: the rollout rolls back with this reason."""

    def __init__(self, reason: str, verdicts: Sequence[Verdict] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.verdicts = list(verdicts)


@dataclass(frozen=True, slots=True)
class Parts:
    """What a driver works with, the same for every rollout of a gateway."""

    config: Config
    units: UnitRegistry
    marks: Marks
    events: EventLog
    samples: Samples
    store: Saver | None  # None: nothing is saved ([admin].state_file = "")
    link: Link | None  # with replicas: the shared rollout (then `store` is it too)
    clock: Callable[[], float] = time.time


class Driver:
    """Drives one record from where it stands until it ends, or another replica drives it."""

    def __init__(self, parts: Parts, record: Record, spec: Spec) -> None:
        self.parts = parts
        self.settings = parts.config.rollout
        self.units = parts.units
        self.record = record
        self.spec = spec
        self._golden_done: tuple[int, int] | None = None
        self._others: dict[str, Any] = {}  # the other processes' windows, by process
        self._renewed = asyncio.get_running_loop().time()  # the lease, last renewed
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def start(self) -> None:
        apply(self.units, self.record, self.spec)
        self._task = asyncio.create_task(self._run(), name=f"rollout-{self.record.id}")

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        """Stop where it is (the record says so); from its own task, only forget the task.
        A driver that swallowed its cancellation (in a store's call) ends at its next tick."""
        self._stopped = True
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            await end(task, within=STOP_WITHIN_S, log=log)

    # -- what an operator asks of the driving process ------------------------------------

    async def pause(self, who: str) -> None:
        record = self.record
        if record.state == "running":
            record.state, record.reason = "paused", f"paused by {who}"
            await self.save()
            self.parts.events.record(subject(record), "rollout paused", record.reason, who)

    async def resume(self, who: str) -> None:
        record = self.record
        if record.state == "paused":
            record.state, record.reason = "running", f"resumed by {who}"
            if record.step >= 0:  # the step starts over
                record.since = self.parts.clock()
                record.epoch += 1  # on fresh samples
                apply(self.units, record, self.spec)
            await self.save()
            self.parts.events.record(subject(record), "rollout resumed", record.reason, who)

    async def end(self, state: str, reason: str, who: str = "rollout") -> None:
        """Rolled back or aborted: the old revision everywhere again, at once."""
        record, spec = self.record, self.spec
        self.units.set_revisions(Revisions(self.units.revisions.serving))
        record.state = "aborted" if state == "aborted" else "rolled_back"
        record.reason, record.ended = reason, self.parts.clock()
        for unit_id in record.drained:
            if unit_id in self.units.units:
                await self.parts.marks.set_state(
                    unit_id, "enabled", f"rollout {record.id} rolled back", f"rollout {record.id}"
                )
        await self.save()
        await self._let_go()
        self.parts.events.record(
            subject(record),
            f"rollout {record.state.replace('_', ' ')}",
            reason,
            who,
            logging.WARNING,
        )
        if spec.hooks:
            await self._hooks("rollback", None, fail=False)

    # -- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._driven()
        except LostLease as exc:  # the successor carries on: nothing is ended here
            log.warning("rollout %s: no longer driven here (%s)", self.record.id, exc)

    async def _driven(self) -> None:
        record = self.record
        try:
            async with aiohttp.ClientSession() as session:
                while record.live and not self._stopped:
                    if self.parts.link is not None:
                        await self._exchange()
                    if record.live:
                        await self._tick(session)
                    if record.live:
                        await asyncio.sleep(TICK)
        except Failed as failure:
            if failure.verdicts:
                record.gates = [verdict_json(v) for v in failure.verdicts]
            await self.end("rolled_back", failure.reason)
        except (asyncio.CancelledError, LostLease):
            raise
        except Exception as exc:  # a bug must not leave the fleet half moved
            log.exception("rollout %s: the driver failed", record.id)
            await self.end("rolled_back", f"the rollout's driver failed: {exc!r}")

    async def _exchange(self) -> None:
        """With replicas, each tick: the lease renewed, samples swapped, operators' asks
        taken. A store out of reach for longer than the lease means another replica may
        drive now: stop."""
        link, record = self.parts.link, self.record
        assert link is not None
        mine = self.parts.samples.windows()
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
                await self.end("aborted", f"aborted by {who}", who)

    async def _tick(self, session: aiohttp.ClientSession) -> None:
        record = self.record
        now = self.parts.clock()
        if record.step >= 0 or record.state == "paused":
            self._guard()
        if record.state == "paused":
            return
        if record.step < 0:
            await self._prepare(session, now)
        elif now - record.since >= self.spec.step_seconds:
            await self._judge(session, now)

    def _guard(self) -> None:
        """The hard guards, on the cell's samples so far: they roll back within a tick."""
        record, spec = self.record, self.spec
        cell = spec.cells[record.cell]
        for unit in self._new_units(cells=spec.cells[: record.cell + 1]):
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

    async def _prepare(self, session: aiohttp.ClientSession, now: float) -> None:
        record, spec = self.record, self.spec
        cell = spec.cells[record.cell]
        if record.prepared < record.cell:
            await self._hooks("prepare", cell, fail=True)
            record.prepared, record.since = record.cell, self.parts.clock()
            await self.save()
            return
        units = [u for u in self._new_units(cells=(cell,)) if u.in_service]
        if not units or not all(u.health.routable and u.admitting for u in units):
            if now - record.since > spec.ready_timeout:
                have = ", ".join(f"{u.id} ({u.health.value})" for u in units) or "none"
                raise Failed(
                    f"cell {cell}: the units of revision {spec.to!r} were not ready "
                    f"within {spec.ready_timeout:g} s (units: {have})"
                )
            return
        await self._golden(session, cell)
        await self._next_step(0)

    async def _judge(self, session: aiohttp.ClientSession, now: float) -> None:
        """At a step's end: the golden prompts once, then the step's gates."""
        record, spec = self.record, self.spec
        cell = spec.cells[record.cell]
        if self._golden_done != (record.cell, record.step) and self.settings.golden_every_step:
            await self._golden(session, cell)
            self._golden_done = (record.cell, record.step)
        look = record.cell * len(spec.steps) + record.step + 1
        windows = self._windows()
        old, latency = baseline(record, spec, windows)
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
                await self.save()
                self.parts.events.record(
                    subject(record), "rollout paused", record.reason, "rollout", logging.WARNING
                )
            return
        self.parts.events.record(
            subject(record),
            "rollout verdict",
            f"cell {cell} at {spec.steps[record.step]}%: every gate passed",
            "rollout",
        )
        if record.step + 1 < len(spec.steps):
            await self._next_step(record.step + 1)
        else:
            await self._retire(cell)

    async def _next_step(self, step: int) -> None:
        record, spec = self.record, self.spec
        record.step, record.share = step, spec.steps[step] / 100
        record.since = self.parts.clock()
        record.epoch += 1
        apply(self.units, record, spec)
        await self.save()
        cell = spec.cells[record.cell]
        self.parts.events.record(
            subject(record),
            "rollout step",
            f"cell {cell}: {spec.steps[step]}% of its conversations on {spec.to!r}",
            "rollout",
        )

    async def _retire(self, cell: str) -> None:
        """The cell moved: its old units drained (answers in flight run to their end, the
        guards judged meanwhile), the retire hooks told, and the next cell begun (or the
        rollout done)."""
        record, spec = self.record, self.spec
        old = [
            u
            for u in self.units.units.values()
            if u.cell == cell and u.revision == spec.old and u.in_service
        ]
        who = f"rollout {record.id}"
        for unit in old:
            await self.parts.marks.set_state(
                unit.id, "draining", f"cell {cell} moved to {spec.to!r}", who
            )
            record.drained.append(unit.id)
        await self.save()
        await self._drained(old)
        await self._hooks("retire", cell, fail=False, old=[u.id for u in old])
        record.cell += 1
        record.step, record.share, record.since = -1, 0.0, self.parts.clock()
        record.epoch += 1
        apply(self.units, record, spec)
        await self.save()
        self.parts.events.record(
            subject(record),
            "rollout cell done",
            f"cell {cell} serves {spec.to!r}; its old units are drained",
            "rollout",
        )
        if record.cell >= len(spec.cells):
            await self._succeed()

    async def _drained(self, units: Sequence[UnitState]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.parts.config.timeouts.total
        while busy := await self.parts.marks.busy(units):
            self._guard()
            if loop.time() > deadline:
                log.warning(
                    "units %s still have answers in flight after the total timeout",
                    ", ".join(busy),
                )
                return
            await asyncio.sleep(TICK)
            if self.parts.link is not None:
                await self._exchange()

    async def _succeed(self) -> None:
        record, spec = self.record, self.spec
        revisions = self.units.revisions
        for cell in spec.cells:
            revisions = revisions.with_serving(cell, spec.to)
        self.units.set_revisions(Revisions(revisions.serving))
        if self.parts.store is not None:
            await self.parts.store.set_serving(dict(revisions.serving))
        record.state, record.ended = "succeeded", self.parts.clock()
        record.reason = f"every cell serves {spec.to!r}"
        await self.save()
        await self._let_go()
        self.parts.events.record(subject(record), "rollout succeeded", record.reason, "rollout")
        await self._hooks("done", None, fail=False)

    # -- helpers -----------------------------------------------------------------------------

    async def save(self) -> None:
        await save(self.parts.store, self.record)

    async def _let_go(self) -> None:
        """The rollout ended: with replicas, its samples dropped and its lease given up."""
        link = self.parts.link
        if link is None:
            return
        self._others = {}
        try:
            await link.clear_samples()
            await link.release()
        except Exception as exc:  # the lease expires by itself; the samples within a day
            log.warning("the ended rollout's lease and samples were not cleared: %s", exc)

    def _windows(self) -> Windows:
        """The current split's samples, this process's and (with replicas) the others'."""
        found = self.parts.samples.windows()
        if found is None:
            return _EMPTY
        if not self._others:
            return found
        summed = Windows(found.key, found.old, found.new)
        return add_wires(summed, [found.wire(), *self._others.values()])

    def _new_units(self, cells: Sequence[str]) -> list[UnitState]:
        to = self.spec.to
        return [u for u in self.units.units.values() if u.cell in cells and u.revision == to]

    async def _golden(self, session: aiohttp.ClientSession, cell: str) -> None:
        record, spec = self.record, self.spec
        if not spec.golden:
            return
        new = [u for u in self._new_units((cell,)) if u.routable]
        old = [u for u in self.units.units.values() if u.revision == spec.old and u.routable]
        old.sort(key=lambda u: u.cell != cell)  # the same cell's first
        if not new or not old:
            raise Failed(
                f"cell {cell}: no routable unit of {'the new' if not new else 'the old'}"
                " revision to ask the golden prompts"
            )
        results = await run_golden(
            spec.golden, old[0], new[0], session, within=self.parts.config.timeouts.total
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
        self, moment: str, cell: str | None, fail: bool, old: Sequence[str] = ()
    ) -> None:
        record, spec = self.record, self.spec
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
                [u.id for u in self._new_units(cells)],
            )  # fmt: skip
            result = await run_hook(hook, moment, context)
            level = logging.INFO if result.ok else logging.WARNING
            self.parts.events.record(
                subject(record),
                f"rollout hook {name}",
                f"{moment}: {result.detail}",
                "rollout",
                level,
            )
            if fail and not result.ok:
                raise Failed(f"{moment} hook {name} failed: {result.detail}")


async def save(store: Saver | None, record: Record) -> None:
    """The record to the store, if any: a failed write is logged (the rollout goes on, a
    restart would not find it); LostLease if another process drives it now."""
    if store is None:
        return
    try:
        await store.put_rollout(record.id, record.started, record.wire())
    except LostLease:
        raise
    except Exception as exc:
        log.warning(
            "rollout %s: cannot save its state (%s): a restart would lose it", record.id, exc
        )


def apply(units: UnitRegistry, record: Record, spec: Spec) -> None:
    """The record's split, as routing applies it (nothing once it has ended)."""
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
    units.set_revisions(Revisions(units.revisions.serving, canary))


def baseline(record: Record, spec: Spec, windows: Windows) -> tuple[Window, bool]:
    """What the new revision's answers in the cell are judged against, and whether its
    latency is (like with like: never old units carrying less load each than the new ones
    do). Up to 50%, the cell's own old units (they carry more). Above, the old units of the
    cells not yet moved, each carrying its whole cell as the new ones do theirs; in the last
    cell, none is left: the step before stands in for errors, breaks and finish reasons, and
    latency is not compared."""
    if record.share <= 0.5:
        return windows.step.old, True
    if windows.others.old.requests >= spec.gates.min_samples:
        return windows.others.old, True
    return windows.before.old, False


def subject(record: Record) -> str:
    return f"rollout:{record.id}"


_EMPTY = Windows(("", 0, 0), "", "")
LATENCY_GATES = frozenset({"ttft", "tpot"})


def _uncompared(verdict: Verdict) -> Verdict:
    return Verdict(
        verdict.gate,
        "pass",
        {},
        "not compared: no old unit carries the load the new ones do (the last cell above 50%)",
    )
