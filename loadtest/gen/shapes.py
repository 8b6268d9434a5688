"""Load shapes: closed loop (fixed concurrency) and open loop (Poisson arrivals).

The open loop stamps each request with the time it was *due*, so when the client or the
server falls behind, the wait shows up in the latencies instead of silently thinning the
load (coordinated omission).

Requests start only within `duration`. Those still in flight at its end get `grace` more
seconds to finish, and are then cut: so a run lasts at most `duration + grace`, however long
its answers are. A request that ends in the grace is a whole answer and is measured like any
other; one that is cut is recorded as such, neither a success nor a failure.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from loadtest.gen.client import RequestRecord, open_session, pool_limit, send
from loadtest.gen.workload import Workload


@dataclass(frozen=True, slots=True)
class RunConfig:
    url: str
    concurrency: int | None = None
    rate: float | None = None
    duration: float | None = None
    requests: int | None = None
    timeout: float = 60.0
    seed: int = 0
    # Sent with every request (--api-key, --header); never written to result.json.
    headers: tuple[tuple[str, str], ...] = ()
    # Seconds after `duration` that requests in flight may take before they are cut; None
    # waits for each of them (each is still bounded by `timeout`).
    grace: float | None = None

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency and rate")
        if self.duration is None and self.requests is None:
            raise ValueError("give a duration, a request count or both")
        if self.grace is not None and self.grace < 0:
            raise ValueError("grace must be >= 0")

    @property
    def cut_at(self) -> float | None:
        """Seconds from the start at which requests still in flight are cut, if ever."""
        if self.duration is None or self.grace is None:
            return None
        return self.duration + self.grace


@dataclass(slots=True)
class RunState:
    """Shared between the shape, the progress line and the report."""

    origin: float = field(default_factory=time.perf_counter)
    records: list[RequestRecord] = field(default_factory=list)
    started: int = 0
    finished: int = 0  # ended or cut
    errors: int = 0
    cut: int = 0
    ended_at: float | None = None
    # When each request (by index) ended, failed or not: the time series buckets failures.
    ends: dict[int, float] = field(default_factory=dict)
    # The run's bounds, for the progress line: the end of sending and the end of the grace.
    duration: float | None = None
    cut_at: float | None = None

    def elapsed(self) -> float:
        end = self.ended_at if self.ended_at is not None else time.perf_counter()
        return end - self.origin

    @property
    def in_flight(self) -> int:
        return self.started - self.finished


class Runner:
    """Runs one shape to its bounds; `state` is live while it runs, for the progress line.

    Without `session` each run opens (and closes) its own connections, so its first requests
    pay connection setup. Runs that follow one another, such as sweep points, can pass one
    session (see `client.open_session`) to keep the connections warm between them.
    """

    def __init__(
        self, config: RunConfig, workload: Workload, session: aiohttp.ClientSession | None = None
    ) -> None:
        limit = None if session is None else pool_limit(session)
        if limit is not None and (config.concurrency is None or config.concurrency > limit):
            load = f"concurrency {config.concurrency}" if config.concurrency else "an open loop"
            raise ValueError(f"the session's pool of {limit} connections would throttle {load}")
        self.config = config
        self.workload = workload
        self.state = RunState(duration=config.duration, cut_at=config.cut_at)
        self._session = session

    async def run(self) -> RunState:
        if self._session is not None:
            return await self._drive(self._session)
        async with open_session(self.config.concurrency) as session:
            return await self._drive(session)

    async def _drive(self, session: aiohttp.ClientSession) -> RunState:
        self.state.origin = time.perf_counter()  # the clock starts with the load
        if self.config.concurrency is not None:
            load = self._closed(session, self.config.concurrency)
        else:
            assert self.config.rate is not None
            load = self._open(session, self.config.rate)
        await self._until_cut(load)
        self.state.ended_at = time.perf_counter()
        return self.state

    async def _until_cut(self, load: Coroutine[Any, Any, None]) -> None:
        """Runs the load; at `cut_at` what is still in flight is cancelled, and each request
        so cancelled is recorded as cut (`_one`)."""
        cut_at = self.config.cut_at
        if cut_at is None:
            await load
            return
        deadline = asyncio.timeout(cut_at - self.state.elapsed())
        try:
            async with deadline:
                await load
        except TimeoutError:
            if not deadline.expired():
                raise

    def _may_start(self, due: float) -> bool:
        """Both bounds apply: nothing is sent at or after the deadline or past the count."""
        cfg = self.config
        if cfg.requests is not None and self.state.started >= cfg.requests:
            return False
        return cfg.duration is None or due < cfg.duration

    def _claim(self, due: float) -> RequestRecord:
        """Counted synchronously, before any await, so the count bound is never overshot."""
        record = RequestRecord(index=self.state.started, scheduled=due)
        self.state.started += 1
        return record

    async def _one(self, session: aiohttp.ClientSession, record: RequestRecord) -> None:
        state = self.state
        spec = self.workload.next_request()
        cfg, tokenizer = self.config, self.workload.tokenizer
        try:
            await send(
                session, cfg.url, spec, record, state.origin, cfg.timeout, cfg.headers, tokenizer
            )
        except asyncio.CancelledError:
            # Cut at the end of the grace; an answer already whole (`e2e` is set once the
            # last byte came) was only reading the end of its stream, and is kept as ended.
            if record.e2e is None:
                record.ended = "cut"
            self._ended(record)
            raise
        self._ended(record)

    def _ended(self, record: RequestRecord) -> None:
        state = self.state
        end = time.perf_counter() - state.origin
        duration = self.config.duration
        if record.ended == "run" and duration is not None and end > duration:
            record.ended = "grace"
        state.ends[record.index] = end
        state.records.append(record)
        state.finished += 1
        if record.ended == "cut":
            state.cut += 1
        elif not record.ok:
            state.errors += 1

    async def _closed(self, session: aiohttp.ClientSession, concurrency: int) -> None:
        async def worker() -> None:
            while self._may_start(self.state.elapsed()):
                await self._one(session, self._claim(self.state.elapsed()))

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def _open(self, session: aiohttp.ClientSession, rate: float) -> None:
        rng = random.Random(self.config.seed)
        tasks: set[asyncio.Task[None]] = set()
        due = rng.expovariate(rate)
        while self._may_start(due):
            delay = due - self.state.elapsed()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self._one(session, self._claim(due)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            due += rng.expovariate(rate)
        if tasks:
            await asyncio.gather(*tasks)
