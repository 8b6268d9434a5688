"""The chaos suite's measuring code: drive load through the gateway, classify every request,
fire faults on a schedule, read the gateway's ops listener, and build one report row.

Every request ends in exactly one outcome, judged from the client side:

- `completed`: HTTP 200, a `finish_reason`, `[DONE]`, and no SSE `error` event;
- `failed`: an explicit error the client can act on: an OpenAI-shaped JSON error answer
  (429/502/503/504...), an SSE `error` event, or no answer at all (connection refused);
- `lost`: anything else: a stream that ends without `[DONE]` and without an error event, a
  `[DONE]` without a `finish_reason`, a broken body, or a hang past the request's deadline;
- `cancelled`: the client itself went away (only the disconnect scenario does that).

A request "started" once it received a data event that is not an error (the gateway's first
byte). Failures of requests that never started must be 0: the gateway retries those
elsewhere. A stream "in flight at the fault" had started before the fault and not yet ended,
on the faulted unit(s); the share of those that still completed is what mid-stream resumption
(issue 7) must bring to >= 99%. Until it lands the gateway ends them with an error event, so
that share is reported but asserted only when `RESUME_LANDED` (see `resume_landed`).
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from gateway.config import ConfigError, config_from_dict
from loadtest.gen.client import CHAT_PATH, RequestRecord, classify
from loadtest.gen.shapes import RunConfig, Runner, RunState
from loadtest.gen.stats import Slo, aggregate
from loadtest.gen.workload import RequestSpec, Workload, WorkloadConfig
from tests.support import sse_events

AIM = 0.99  # issue 7: share of in-flight streams completed through resumption


def gateway_has_resume() -> bool:
    """Whether the gateway knows mid-stream resumption: its config accepts a `[resume]` table
    (unknown keys are refused, so this flips by itself when resumption lands)."""
    raw = {
        "gateway": {"port": 0, "models": ["m"]},
        "metrics": {"port": 0},
        "admin": {"enabled": False},
        "resume": {"enabled": True, "max_resumes": 2},
        "units": [{"id": "u0", "leader": "http://127.0.0.1:1", "nodes": ["http://127.0.0.1:1"]}],
    }
    try:
        config_from_dict(raw)
    except ConfigError:
        return False
    return True


def resume_landed() -> bool:
    """The gateway's own answer unless `UNITGATE_CHAOS_RESUME=0|1` overrides it: 0 runs the
    suite with resumption switched off (a baseline), 1 asserts the aim even without it."""
    forced = os.environ.get("UNITGATE_CHAOS_RESUME")
    if forced in ("0", "1"):
        return forced == "1"
    return gateway_has_resume()


# The one switch: the in-flight-completed assertion of the scenarios where resumption applies,
# and `[resume] enabled` in the gateway configs the suite writes (when the gateway has it).
RESUME_LANDED = resume_landed()
RESUME_SECTION: dict[str, Any] | None = (
    {"enabled": RESUME_LANDED, "max_resumes": 2} if gateway_has_resume() else None
)


# --- one request --------------------------------------------------------------------------


@dataclass(slots=True)
class Trace:
    """What the client saw of one request; times are `time.perf_counter()` values."""

    index: int
    sent_at: float = 0.0
    unit: str | None = None
    status: int | None = None
    started_at: float | None = None  # first data event that is not an error
    ended_at: float | None = None
    finish_reason: str | None = None
    error_event: str | None = None  # the code (or message) of an SSE error event
    error_body: str | None = None  # the code of a JSON error answer
    done: bool = False
    problem: str | None = None  # what went wrong on the wire (exception kind, no_done, ...)
    cancelled: bool = False

    @property
    def outcome(self) -> str:
        if self.cancelled:
            return "cancelled"
        if self.error_event is not None or self.error_body is not None:
            return "failed"
        if self.status == 200 and self.done and self.finish_reason and self.problem is None:
            return "completed"
        if self.status is None and self.problem in NO_ANSWER:
            return "failed"  # nothing was accepted: the client knows, and may retry
        return "lost"

    @property
    def started(self) -> bool:
        return self.started_at is not None

    @property
    def kind(self) -> str:
        """A short label of how a request that did not complete ended, for the notes."""
        if self.error_event is not None:
            return f"error_event:{self.error_event}"
        if self.error_body is not None:
            return f"http_{self.status}:{self.error_body}"
        return self.problem or ("no_finish_reason" if self.done else "no_done")


NO_ANSWER = ("connection_refused", "connection_error")


async def send_traced(
    session: aiohttp.ClientSession,
    base_url: str,
    spec: RequestSpec,
    trace: Trace,
    timeout_s: float,
    on_started: Callable[[aiohttp.ClientResponse], None] | None = None,
) -> Trace:
    """One streamed chat completion, read to its end (or its deadline) and classified.

    `on_started(resp)` runs once the stream has started; whoever aborts that connection later
    (a client that goes away) sets `trace.cancelled` first, and the request counts as such."""
    headers = {"Content-Type": "application/json"}
    if spec.session_id is not None:
        headers["x-session-id"] = spec.session_id
    events: list[Any] = []  # what arrived, even when the read ends in an exception

    def seen(so_far: list[Any]) -> None:
        nonlocal events
        events = so_far
        last = so_far[-1]
        if trace.started_at is None and isinstance(last, dict) and "error" not in last:
            trace.started_at = time.perf_counter()
            if on_started is not None and resp is not None:
                on_started(resp)

    trace.sent_at = time.perf_counter()
    resp: aiohttp.ClientResponse | None = None
    try:
        async with asyncio.timeout(timeout_s):
            resp = await session.post(base_url + CHAT_PATH, data=spec.body, headers=headers)
            trace.status, trace.unit = resp.status, resp.headers.get("x-unitgate-unit")
            if resp.status != 200:
                trace.error_body = _error_code(await resp.read())
                if trace.error_body is None:
                    trace.problem = f"http_{resp.status}_without_error_body"
            else:
                await sse_events(resp, seen)
                trace.problem = None if "[DONE]" in events else "ended_without_done"
    except TimeoutError:
        trace.problem = "hang_past_deadline"
    except Exception as exc:  # every failure is data for the report
        trace.problem = _problem(exc, resp)
    finally:
        trace.ended_at = time.perf_counter()
        if resp is not None:
            resp.release()
    _judge(events, trace)
    return trace


def _judge(events: list[Any], trace: Trace) -> None:
    """What the events say: [DONE], the first error event, a finish_reason."""
    trace.done = "[DONE]" in events
    for event in events:
        if not isinstance(event, dict):
            continue
        if "error" in event and trace.error_event is None:
            trace.error_event = _code_of(event["error"])
        for choice in event.get("choices") or ():
            if isinstance(choice, dict) and choice.get("finish_reason"):
                trace.finish_reason = str(choice["finish_reason"])
    if trace.error_event is not None and trace.problem == "ended_without_done":
        trace.problem = None  # an error event is an explicit end: nothing went missing


def _problem(exc: BaseException, resp: aiohttp.ClientResponse | None) -> str:
    kind = classify(exc)
    if resp is None and isinstance(exc, aiohttp.ServerDisconnectedError):
        return "connection_error"  # closed before any answer: nothing was accepted
    if isinstance(exc, aiohttp.ClientConnectorError) and exc.os_error.errno == errno.ECONNRESET:
        return "connection_error"
    return kind


def _code_of(error: object) -> str:
    if isinstance(error, dict):
        return str(error.get("code") or error.get("type") or error.get("message") or "error")
    return str(error)


def _error_code(body: bytes) -> str | None:
    """The code of an OpenAI-shaped error answer, None if the body is not one."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        return _code_of(doc["error"])
    return None


class ChaosRunner(Runner):
    """loadtest.gen's load shapes and bounds, with every request traced as above. The
    aggregate latency numbers of loadtest.gen still apply: the record is filled in too.

    It overrides `Runner._one`, the one place a request is sent; should that change, no trace
    is taken and every scenario fails on "the fault hit no stream in flight"."""

    def __init__(self, config: RunConfig, workload: Workload) -> None:
        super().__init__(config, workload)
        self.traces: list[Trace] = []

    async def _one(self, session: aiohttp.ClientSession, record: RequestRecord) -> None:
        state = self.state
        spec = self.workload.next_request()
        trace = Trace(record.index)
        self.traces.append(trace)
        await send_traced(session, self.config.url, spec, trace, self.config.timeout)
        record.status = trace.status
        record.max_tokens = spec.max_tokens
        record.error = None if trace.outcome == "completed" else trace.kind
        if trace.started_at is not None:
            record.ttft = trace.started_at - state.origin - record.scheduled
        if trace.ended_at is not None:
            record.e2e = trace.ended_at - state.origin - record.scheduled
        state.ends[record.index] = time.perf_counter() - state.origin
        state.records.append(record)
        state.finished += 1
        state.errors += 0 if record.ok else 1


def workload(model: str, max_tokens: int, seed: int = 7) -> Workload:
    config = WorkloadConfig(model, max_tokens=max_tokens, ignore_eos=True, seed=seed)
    return Workload(config)


# --- faults on a schedule -----------------------------------------------------------------


@dataclass(slots=True)
class Fault:
    """`action` runs `at` seconds after the load starts, and once `when` (if given) holds
    for the requests so far, waiting at most `WHEN_WAIT_S` more for it; when it ran is kept."""

    at: float
    name: str
    action: Callable[[], Awaitable[object]]
    when: Callable[[Sequence[Trace]], bool] | None = None
    fired_perf: float | None = None
    fired_wall: float | None = None
    done_perf: float | None = None  # when the action returned: the fault's window closes
    error: str | None = None


WHEN_WAIT_S = 10.0


def streaming_on(
    unit: str, count: int = 2, fresh_s: float = 0.5
) -> Callable[[Sequence[Trace]], bool]:
    """At least `count` streams of `unit` started within the last `fresh_s` and still going:
    a fault fired then hits streams with most of their answer still to come (a closed loop on
    a slow unit moves in waves, and a fault fired at the end of one would break nothing)."""

    def ready(traces: Sequence[Trace]) -> bool:
        since = time.perf_counter() - fresh_s
        live = [
            t
            for t in traces
            if t.unit == unit
            and t.started_at is not None
            and t.started_at > since
            and t.ended_at is None
        ]
        return len(live) >= count

    return ready


async def _fire_all(faults: Sequence[Fault], state: RunState, traces: Sequence[Trace]) -> None:
    async def one(fault: Fault) -> None:
        while (delay := fault.at - (time.perf_counter() - state.origin)) > 0:
            await asyncio.sleep(delay)
        if fault.when is not None:
            give_up = time.perf_counter() + WHEN_WAIT_S
            while not fault.when(traces) and time.perf_counter() < give_up:
                await asyncio.sleep(0.005)
        fault.fired_perf, fault.fired_wall = time.perf_counter(), time.time()
        try:
            await fault.action()
        except Exception as exc:  # reported: an uninjected fault must fail the scenario
            fault.error = f"{type(exc).__name__}: {exc}"
        finally:
            fault.done_perf = time.perf_counter()

    await asyncio.gather(*(one(f) for f in faults))


@dataclass
class Load:
    runner: ChaosRunner
    faults: list[Fault]
    state: RunState
    resumptions_before: dict[str, float] = field(default_factory=dict)

    @property
    def traces(self) -> list[Trace]:
        return self.runner.traces


async def run_load(
    run: RunConfig, work: Workload, faults: Sequence[Fault], ops: Ops | None = None
) -> Load:
    """The load runs to its bounds while the faults fire; both must be done to return.
    A fault scheduled past the load's end still fires (the load does not cancel it).
    With `ops`, the gateway's resumption counters are read first (see `conclude`)."""
    before = await asyncio.to_thread(resumptions, ops) if ops is not None else {}
    runner = ChaosRunner(run, work)
    firing = asyncio.create_task(_fire_all(faults, runner.state, runner.traces))
    try:
        state = await runner.run()
        await firing
    finally:
        if not firing.done():
            firing.cancel()
            await asyncio.gather(firing, return_exceptions=True)
    return Load(runner, list(faults), state, before)


# --- the gateway's operator listener ------------------------------------------------------


@dataclass
class Ops:
    """/metrics and /admin of one gateway (the operator listener)."""

    url: str
    token: str | None = None

    def _get(self, path: str, timeout: float = 5.0) -> bytes:
        req = urllib.request.Request(self.url + path)
        if self.token is not None:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body: bytes = resp.read()
            return body

    def admin(self, path: str, body: dict[str, Any] | None = None) -> Any:
        req = urllib.request.Request(self.url + path, data=orjson.dumps(body or {}), method="POST")
        req.add_header("Content-Type", "application/json")
        if self.token is not None:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=5) as resp:
            return orjson.loads(resp.read())

    def unit(self, unit_id: str) -> dict[str, Any]:
        doc: dict[str, Any] = orjson.loads(self._get(f"/admin/units/{unit_id}"))
        return doc

    def units(self) -> list[dict[str, Any]]:
        doc: dict[str, Any] = orjson.loads(self._get("/admin/units"))
        return list(doc["units"])

    def events(self, unit: str | None = None) -> list[dict[str, Any]]:
        query = "?limit=10000" + (f"&unit={unit}" if unit else "")
        doc: dict[str, Any] = orjson.loads(self._get("/admin/events" + query))
        return list(doc["events"])

    def metrics(self) -> str:
        return self._get("/metrics").decode()

    def gauges(self, name: str) -> dict[str, float]:
        """Every sample of one gauge, keyed by its label text."""
        return samples(self.metrics(), name)

    def counter(self, name: str) -> float:
        return sum(samples(self.metrics(), name).values())


def resumptions(ops: Ops) -> dict[str, float]:
    """`unitgate_resumptions_total` summed over units, by outcome ({} before resumption)."""
    out: dict[str, float] = {}
    for labels, value in samples(ops.metrics(), "unitgate_resumptions_total").items():
        match = re.search(r'outcome="([^"]*)"', labels)
        outcome = match.group(1) if match else "?"
        out[outcome] = out.get(outcome, 0.0) + value
    return out


def samples(text: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key[len(name) :]] = float(value)
    return out


async def until(check: Callable[[], object], within: float, what: str, step: float = 0.05) -> Any:
    """Poll `check` (sync; run in a thread) until truthy, failing at the deadline."""
    deadline = time.monotonic() + within
    last: object = None
    while True:
        try:
            result = await asyncio.to_thread(check)
            if result:
                return result
        except Exception as exc:  # keep polling; the last failure goes in the message
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within} s (last: {last!r})")
        await asyncio.sleep(step)


async def gauges_back_to_zero(ops: Ops, within: float = 10.0) -> dict[str, float]:
    """Waits for every unit's in-flight gauge and the queue depth to be 0; returns them."""

    def zero() -> dict[str, float]:
        text = ops.metrics()
        values = samples(text, "unitgate_unit_inflight") | samples(text, "unitgate_queue_depth")
        if not values or any(values.values()):
            raise AssertionError(f"gauges {values}")  # until() reports the last one
        return values

    result: dict[str, float] = await until(zero, within, "in-flight gauges back to 0")
    return result


def first_event_after(
    ops: Ops, unit: str, what: Iterable[str], after_wall: float
) -> dict[str, Any] | None:
    kinds = set(what)
    for event in ops.events(unit):
        if event["what"] in kinds and event["time"] >= after_wall:
            return event
    return None


async def ejection_time(
    ops: Ops, unit: str, after_wall: float, within: float = 10.0
) -> tuple[float, str]:
    """Seconds from the fault until the gateway took `unit` out (health or breaker event),
    and the event's reason."""
    event = await until(
        lambda: first_event_after(ops, unit, ("unhealthy", "ejected"), after_wall),
        within,
        f"unit {unit} ejected",
    )
    return event["time"] - after_wall, f"{event['what']}: {event['reason']}"


# --- one scenario's report ----------------------------------------------------------------


@dataclass
class Report:
    scenario: str
    traces: list[Trace]
    fault_perf: float | None  # when the fault began
    faulted_units: tuple[str, ...] | None  # None: every unit's streams are in play
    # True: the fault breaks the faulted units' streams in flight, and completing them is
    # resumption's job. False: the fault must break nothing a client sees (0 failed).
    resumable: bool
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

    @property
    def not_started_failures(self) -> list[Trace]:
        return [t for t in self.traces if t.outcome in ("failed", "lost") and not t.started]

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

    def kinds(self, outcome: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.of(outcome):
            counts[t.kind] = counts.get(t.kind, 0) + 1
        return dict(sorted(counts.items()))

    def row(self) -> str:
        done, flight = self.in_flight_completed
        share = f"{done}/{flight}" + (f" ({100 * done / flight:.0f}%)" if flight else "")
        if self.resumable and flight and not RESUME_LANDED:
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
            failed = self.kinds("failed")
            assert not failed, f"{self.scenario}: clients saw failures {failed}\n{self.summary()}"
        if flight and (not self.resumable or RESUME_LANDED):
            assert done / flight >= AIM, (
                f"{self.scenario}: only {done}/{flight} in-flight streams completed "
                f"(aim {AIM:.0%}; resumption {'on' if RESUME_LANDED else 'not needed'})\n"
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
    if ops is not None and RESUME_LANDED:
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
