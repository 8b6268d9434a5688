"""Firing a scenario's actions at their times, while the load runs.

Each action waits on its own, so one slow action (a health URL that hangs) cannot delay the
next; every failure becomes the action's outcome in the report, because a fault that could
not be injected is a result the reader must see, not a reason to throw the run away.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from loadtest.gen.scenario import SIGNALS, Action, AdminAction, SignalAction, SimFaultAction
from loadtest.gen.shapes import RunState
from loadtest.gen.timeseries import failover, timeseries

ACTION_TIMEOUT_S = 5.0
NOT_RUN = "not run: the load ended first"

# Pid lookups through /health by health URL, kept across a run's actions (`_signal`).
Pids = dict[str, "asyncio.Future[int]"]


@dataclass(slots=True)
class Outcome:
    """`fired` is seconds from run start when the action began; `error` None means ok."""

    action: Action
    fired: float | None = None
    error: str | None = NOT_RUN
    detail: str | None = None

    def to_json(self, buckets: Sequence[Mapping[str, object]]) -> dict[str, object]:
        """Failover counts from when the action fired; an action that never ran has none."""
        recovery: tuple[float | None, int | None] = (None, None)
        if self.fired is not None and self.error is None:
            recovery = failover(buckets, self.fired)
        return {
            "index": self.action.index,
            "at": self.action.at,
            "kind": self.action.kind_name,
            "action": self.action.describe(),
            "fired_s": None if self.fired is None else round(self.fired, 4),
            "outcome": "ok" if self.error is None else self.error,
            "detail": self.detail,
            "failover_s": recovery[0],
            "failed_after": recovery[1],
        }


class ActionRunner:
    """Owns the task that fires the actions; times count from `state.origin`.

    The origin is read when each wait begins, not when the runner is built, because the runner
    resets it when its HTTP session is ready, which happens before this task first runs.
    """

    def __init__(self, actions: list[Action], state: RunState) -> None:
        self.outcomes = [Outcome(a) for a in actions]
        self._state = state
        # Pids found through /health, by health URL: a frozen (SIGSTOPped) node cannot answer
        # /health, so `cont` signals the pid an earlier action found there.
        self._pids: Pids = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run_all())

    async def stop(self) -> list[Outcome]:
        """Cancel what has not fired yet; an action already firing is cancelled too."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        return self.outcomes

    async def _run_all(self) -> None:
        timeout = aiohttp.ClientTimeout(total=ACTION_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await asyncio.gather(*(self._run_one(session, o) for o in self.outcomes))

    def _now(self) -> float:
        return time.perf_counter() - self._state.origin

    async def _run_one(self, session: aiohttp.ClientSession, outcome: Outcome) -> None:
        # Loop timers may fire up to a clock tick early; an action must never fire before `at`.
        while (delay := outcome.action.at - self._now()) > 0:  # noqa: ASYNC110
            await asyncio.sleep(delay)
        outcome.fired = self._now()
        try:
            outcome.detail = await fire(session, outcome.action, self._pids)
            outcome.error = None
        except asyncio.CancelledError:
            outcome.error = "cancelled: the load ended while it was running"
            raise
        except Exception as exc:  # reported in result.json, never a crash
            outcome.error = _describe(exc)


def _describe(exc: Exception) -> str:
    if isinstance(exc, TimeoutError):
        return f"timed out after {ACTION_TIMEOUT_S:g} s"
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, ActionError) else f"{type(exc).__name__}: {text}"


class ActionError(Exception):
    """The target answered, but not with success."""


async def fire(
    session: aiohttp.ClientSession, action: Action, pids: Pids | None = None
) -> str | None:
    """Run one action now; returns a short detail worth keeping (the pid signalled). `pids`
    remembers the pids found through /health across the actions of one run."""
    kind = action.kind
    if isinstance(kind, AdminAction):
        await _admin(session, kind)
        return None
    if isinstance(kind, SimFaultAction):
        await _post(session, f"{kind.control}/units/{kind.unit}/fault", kind.fault, {})
        return None
    return await _signal(session, kind, {} if pids is None else pids)


async def _admin(session: aiohttp.ClientSession, action: AdminAction) -> None:
    headers = {} if action.token is None else {"Authorization": f"Bearer {action.token}"}
    body: dict[str, object] = {} if action.reason is None else {"reason": action.reason}
    url = f"{action.admin_url}/admin/units/{action.unit}/{action.action}"
    await _post(session, url, body, headers)


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict[str, object], headers: dict[str, str]
) -> None:
    async with session.post(url, json=body, headers=headers) as resp:
        text = await resp.text()
        if resp.status >= 300:
            raise ActionError(f"HTTP {resp.status} from {url}: {text[:200]}")


async def _signal(session: aiohttp.ClientSession, action: SignalAction, pids: Pids) -> str:
    pid = action.pid
    if pid is None:
        url = action.health_url
        assert url is not None
        found = pids.get(url) if action.name == "cont" else None
        if found is not None:
            # An earlier action's lookup, awaited even while it is still out: that action
            # signals first (it waited first), so a `cont` never overtakes its `stop`.
            with contextlib.suppress(ActionError, aiohttp.ClientError, TimeoutError):
                pid = await found
        if pid is None:  # not looked up yet, or that lookup failed: the node is not frozen
            lookup = pids[url] = asyncio.ensure_future(_health_pid(session, url))
            pid = await lookup
    os.kill(pid, SIGNALS[action.name])
    return f"pid {pid}"


async def _health_pid(session: aiohttp.ClientSession, health_url: str) -> int:
    """Any status will do: an unhealthy node still names its pid, and that is all we need."""
    url = f"{health_url}/health"
    async with session.get(url) as resp:
        try:
            body = await resp.json(content_type=None)
        except ValueError:
            raise ActionError(f"{url} did not answer JSON (HTTP {resp.status})") from None
    pid = body.get("pid") if isinstance(body, dict) else None
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        raise ActionError(f"{url} gave no usable pid (HTTP {resp.status})")
    return pid


def add_timeseries(
    result: dict[str, object], state: RunState, outcomes: list[Outcome] | None
) -> None:
    """Adds `timeseries` and, for a scenario run, `actions` (with failover) to a result."""
    series = timeseries(state.records, state.ends, state.elapsed())
    result["timeseries"] = series
    if outcomes is not None:
        buckets = series["buckets"]
        assert isinstance(buckets, list)
        result["actions"] = [o.to_json(buckets) for o in outcomes]
