"""The chaos suite's measuring code: drive load through the gateway, classify every request
and fire faults on a schedule (ops.py reads the gateway's operator listener, report.py builds
one report row).

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
(issue 7) must bring to >= 99%; with resumption off (`RESUME_ON`) the gateway ends them with an
error event, and that share is reported, not asserted.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from loadtest.gen.client import CHAT_PATH, RequestRecord, classify
from loadtest.gen.shapes import RunConfig, Runner, RunState
from loadtest.gen.workload import RequestSpec, Workload, WorkloadConfig
from tests.chaos.ops import Ops, resumptions
from tests.support import sse_events

AIM = 0.99  # issue 7: share of in-flight streams completed through resumption


# Mid-stream resumption is on in the gateway configs the suite writes, and the in-flight share
# of the scenarios it applies to is asserted; `UNITGATE_CHAOS_RESUME=0` switches both off, for
# a baseline of the gateway without it.
RESUME_ON = os.environ.get("UNITGATE_CHAOS_RESUME", "1") != "0"
RESUME_SECTION: dict[str, Any] = {"enabled": RESUME_ON, "max_resumes": 2}


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
    retry_after: str | None = None  # the Retry-After header of an error answer
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
    def refused(self) -> bool:
        """Load shed the way a client can act on: 429 `saturated`, with Retry-After."""
        return self.status == 429 and self.error_body == "saturated" and bool(self.retry_after)

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
                trace.retry_after = resp.headers.get("Retry-After")
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

    def __init__(
        self,
        config: RunConfig,
        workload: Workload,
        faults: Sequence[Fault] = (),
        outlast_s: float | None = None,
    ) -> None:
        super().__init__(config, workload)
        self.traces: list[Trace] = []
        self.faults, self.outlast_s = faults, outlast_s

    def _may_start(self, due: float) -> bool:
        """With `outlast_s`, a closed loop also sends past its duration until every fault's
        window has closed and `outlast_s` more have passed (within `OUTLAST_CAP_S`): a fault
        whose length varies with the machine (a wait for a mark, 200 streams to start) then
        always has live traffic around it, however late it closes."""
        if super()._may_start(due):
            return True
        if self.outlast_s is None or not self.faults or due >= OUTLAST_CAP_S:
            return False
        cfg = self.config
        if cfg.requests is not None and self.state.started >= cfg.requests:
            return False
        closed = [f.done_perf for f in self.faults if f.done_perf is not None]
        if len(closed) < len(self.faults):
            return True  # a fault is still open
        return time.perf_counter() < max(closed) + self.outlast_s

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
OUTLAST_CAP_S = 60.0  # seconds from the load's start past which no request is sent, faults or not


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
    run: RunConfig,
    work: Workload,
    faults: Sequence[Fault],
    ops: Ops | None = None,
    outlast_s: float | None = None,
) -> Load:
    """The load runs to its bounds while the faults fire; both must be done to return.
    A fault scheduled past the load's end still fires (the load does not cancel it), unless
    `outlast_s` is given: then the load sends on until that long after the last fault closed.
    With `ops`, the gateway's resumption counters are read first (see `conclude`)."""
    before = await asyncio.to_thread(resumptions, ops) if ops is not None else {}
    runner = ChaosRunner(run, work, faults, outlast_s)
    firing = asyncio.create_task(_fire_all(faults, runner.state, runner.traces))
    try:
        state = await runner.run()
        await firing
    finally:
        if not firing.done():
            firing.cancel()
            await asyncio.gather(firing, return_exceptions=True)
    return Load(runner, list(faults), state, before)
