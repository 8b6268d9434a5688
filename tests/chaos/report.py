"""One chaos scenario's report: the row of the summary table and the assertions every
scenario shares (see tests/chaos/harness.py for how requests are judged)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadtest.gen.stats import Slo, aggregate
from tests.chaos.harness import AIM, RESUME_ON, Fault, Load, Trace
from tests.chaos.ops import Ops, ejection_time, gauges_back_to_zero, resumptions


@dataclass
class Report:
    scenario: str
    traces: list[Trace]
    fault_perf: float | None  # when the fault began
    faulted_units: tuple[str, ...] | None  # None: every unit's streams are in play
    # True: the fault breaks the faulted units' streams in flight, and completing them is
    # resumption's job. False: the fault must break nothing a client sees (0 failed).
    resumable: bool
    # True: the load is past capacity, and a 429 `saturated` with Retry-After is the answer
    # it must get (explicit load shedding), not a failure.
    refusals_ok: bool = False
    fault_end: float | None = None  # when it ended (conclude: when its action returned)
    ejection_s: float | None = None
    ejection_note: str = "n/a"
    gauges: dict[str, float] | None = None
    gauges_note: str | None = None  # why the gauges could not be read (the gateway exited)
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    latency: str = ""

    def of(self, outcome: str) -> list[Trace]:
        return [t for t in self.traces if t.outcome == outcome]

    def excused(self, trace: Trace) -> bool:
        return self.refusals_ok and trace.refused

    @property
    def not_started_failures(self) -> list[Trace]:
        return [
            t
            for t in self.traces
            if t.outcome in ("failed", "lost") and not t.started and not self.excused(t)
        ]

    @property
    def in_flight(self) -> list[Trace]:
        """Streams running on the faulted units at some moment of the fault: started before
        it ended, not ended before it began (for an instant fault: started before, ended after)."""
        begin = self.fault_perf
        if begin is None:
            return []
        end = self.fault_end if self.fault_end is not None else begin
        return [
            t
            for t in self.traces
            if t.started_at is not None
            and t.started_at < end
            and (t.ended_at is None or t.ended_at > begin)
            and (self.faulted_units is None or t.unit in self.faulted_units)
            and not t.cancelled
        ]

    @property
    def in_flight_completed(self) -> tuple[int, int]:
        flight = self.in_flight
        return sum(1 for t in flight if t.outcome == "completed"), len(flight)

    def kinds(self, outcome: str, excused: bool = True) -> dict[str, int]:
        """Counts by kind; `excused=False` leaves out the refusals this scenario expects."""
        counts: dict[str, int] = {}
        for t in self.of(outcome):
            if excused or not self.excused(t):
                counts[t.kind] = counts.get(t.kind, 0) + 1
        return dict(sorted(counts.items()))

    def row(self) -> str:
        done, flight = self.in_flight_completed
        share = f"{done}/{flight}" + (f" ({100 * done / flight:.0f}%)" if flight else "")
        if self.resumable and flight and not RESUME_ON:
            share += " (not asserted: resumption off)"
        ejection = "n/a" if self.ejection_s is None else f"{self.ejection_s:.2f} s"
        gauges = "0" if self.gauges is not None else (self.gauges_note or "not read")
        failures = self.kinds("failed") | self.kinds("lost")
        ends = [f"{n} x {kind}" for kind, n in failures.items()]
        notes = "; ".join([*([", ".join(ends)] if ends else []), *self.notes])
        cells = [
            self.scenario,
            str(len(self.traces)),
            str(len(self.of("completed"))),
            str(len(self.of("failed"))),
            str(len(self.of("lost"))),
            str(len(self.not_started_failures)),
            share,
            ejection,
            gauges,
            notes,
        ]
        return "| " + " | ".join(cells) + " |"

    def summary(self) -> str:
        lines = [
            f"{self.scenario}: {len(self.traces)} traced in {self.wall_s:.1f} s",
            f"  completed {len(self.of('completed'))}, failed {self.kinds('failed')}, "
            f"lost {self.kinds('lost')}, cancelled {len(self.of('cancelled'))}",
            f"  not started and failed: {len(self.not_started_failures)}; in flight at the "
            f"fault and completed: {self.in_flight_completed}",
            f"  detection->ejection: {self.ejection_note}; gauges: {self.gauges}",
            f"  latency (loadtest.gen): {self.latency}",
        ]
        return "\n".join(lines)

    def check(self) -> None:
        """The invariants every scenario must meet, and the resumption aim where it applies."""
        lost = self.of("lost")
        assert not lost, f"{self.scenario}: lost requests {self.kinds('lost')}\n{self.summary()}"
        bad = self.not_started_failures
        assert not bad, (
            f"{self.scenario}: {len(bad)} requests failed before their stream started "
            f"({sorted({t.kind for t in bad})})\n{self.summary()}"
        )
        assert self.gauges is not None or self.gauges_note, (
            f"{self.scenario}: in-flight gauges not back to 0: {self.notes}"
        )
        done, flight = self.in_flight_completed
        if self.fault_perf is not None:
            assert flight, f"{self.scenario}: the fault hit no stream in flight\n{self.summary()}"
        if not self.resumable:
            failed = self.kinds("failed", excused=False)
            assert not failed, f"{self.scenario}: clients saw failures {failed}\n{self.summary()}"
        if flight and (not self.resumable or RESUME_ON):
            assert done / flight >= AIM, (
                f"{self.scenario}: only {done}/{flight} in-flight streams completed "
                f"(aim {AIM:.0%}; resumption {'on' if RESUME_ON else 'not needed'})\n"
                f"{self.summary()}"
            )


HEADER = (
    "| scenario | sent | completed | failed (explicit) | lost | not-started failures "
    "| in-flight completed | detection→ejection | in-flight gauges at end | notes |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)
ROWS: list[str] = []  # filled by `record`, printed and written by conftest's summary hook


def record(report: Report) -> None:
    """Keep the row for the session's table and print the details (seen with -s or on failure)."""
    ROWS.append(report.row())
    print("\n" + report.summary())


async def settle_gauges(ops: Ops, report: Report, within: float = 15.0) -> None:
    try:
        report.gauges = await gauges_back_to_zero(ops, within)
    except AssertionError as exc:
        report.notes.append(str(exc))


def fault_errors(faults: Sequence[Fault]) -> list[str]:
    return [f"{f.name}: {f.error}" for f in faults if f.error is not None or f.fired_perf is None]


async def conclude(
    report: Report, load: Load, ops: Ops | None, eject_unit: str | None = None
) -> Report:
    """The common end of a scenario: faults really fired, detection->ejection read from the
    gateway's events log, gauges back to 0, the row recorded, then the invariants checked."""
    errors = fault_errors(load.faults)
    assert not errors, f"{report.scenario}: faults not injected: {errors}"
    report.wall_s = load.state.elapsed()
    report.latency = latency(load)
    ends = [f.done_perf for f in load.faults]
    if report.fault_end is None and report.fault_perf is not None and None not in ends:
        report.fault_end = max(e for e in ends if e is not None)
    missed: str | None = None
    if eject_unit is not None and ops is not None:
        fired = load.faults[0].fired_wall
        assert fired is not None
        try:
            report.ejection_s, report.ejection_note = await ejection_time(ops, eject_unit, fired)
        except AssertionError as exc:
            missed = str(exc)
            report.notes.append(f"{eject_unit} never ejected")
    if ops is not None and report.gauges_note is None:
        await settle_gauges(ops, report)
    if ops is not None and RESUME_ON:
        after = await asyncio.to_thread(resumptions, ops)
        counted = {k: v - load.resumptions_before.get(k, 0.0) for k, v in after.items()}
        text = ", ".join(f"{k} {v:g}" for k, v in sorted(counted.items()) if v) or "none"
        report.notes.append(f"gateway resumptions: {text}")
    record(report)
    assert missed is None, missed
    report.check()
    return report


def latency(load: Load) -> str:
    """loadtest.gen's own aggregate of the completed requests, in one line for the log."""
    summary = aggregate(load.state.records, load.state.elapsed(), Slo())
    parts = []
    for name in ("ttft_ms", "e2e_ms"):
        dist = summary[name]
        assert isinstance(dist, dict)
        if dist["count"]:
            parts.append(f"{name} p50 {dist['p50']:.0f} p99 {dist['p99']:.0f}")
    return ", ".join(parts) or "no completed request"
