"""The dispatcher tests' harness: a Dispatcher wired as gateway/server.py wires it (Rig, built
by the `rigs` fixture) around a real UnitRegistry, Admission, UpstreamClient and Signals, a
recording observer, and real leaders on 127.0.0.1 that answer (or refuse to)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from random import Random
from typing import Any

import orjson
import pytest
from aiohttp import web

from gateway.config import Config
from gateway.errors import UpstreamError
from gateway.outcomes import Failure
from gateway.paths import CHAT_PATH, COMPLETIONS_PATH
from gateway.proxy.call import Call
from gateway.proxy.dispatch import Dispatcher
from gateway.proxy.lease import Lease
from gateway.proxy.upstream import UpstreamClient
from gateway.proxy.validation import RequestInfo
from gateway.routing.admission import Admission
from gateway.routing.forecast import Forecast
from gateway.signals import Observer, Signals
from gateway.units import UnitRegistry, UnitState
from tests.gateway.servers import refused_url
from tests.support import MODEL, chat_body, gateway_config

FIRST = b'data: {"n": 1}\n\n'


# Every unit defaults to this weight; a unit given less is the picker's last choice while
# the others are idle (power of two choices by weighted load), whatever the seed.
HEAVY, LIGHT = 1.0, 0.5


class Recorder(Observer):
    """Every dispatch signal, in order, and how many slots were held when each attempt began."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.events: list[tuple[Any, ...]] = []
        self.held_at_start: list[int] = []
        self.on_retried: Callable[[], object] | None = None

    def rejected(self, call: Call, code: str) -> None:
        self.events.append(("rejected", code))

    def attempt_started(self, call: Call, unit: UnitState) -> None:
        self.held_at_start.append(self.admission.inflight)
        self.events.append(("started", unit.id, call.attempts))

    def attempt_opened(self, call: Call, unit: UnitState, status: int) -> None:
        self.events.append(("opened", unit.id, status))

    def attempt_failed(
        self, call: Call, unit: UnitState, error: UpstreamError, started: float
    ) -> None:
        assert error is call.last_error and unit is call.tried[-1]
        self.events.append(("failed", unit.id, error.kind))

    def retried(self, kind: Failure) -> None:
        self.events.append(("retried", kind))
        if self.on_retried is not None:
            self.on_retried()

    def budget_exhausted(self) -> None:
        self.events.append(("budget_exhausted",))

    def named(self, hook: str) -> list[tuple[Any, ...]]:
        return [e for e in self.events if e[0] == hook]

    def started(self) -> list[str]:
        return [e[1] for e in self.named("started")]


class Rig:
    """A Dispatcher wired as gateway/server.py wires it, for the units in `config`."""

    def __init__(self, config: Config, seed: int = 7, forecast: Forecast | None = None) -> None:
        self.config = config
        self.units = UnitRegistry(config)
        a = config.admission
        self.admission = Admission(
            a.queue_size, a.queue_timeout, a.retry_after, classes=config.priority
        )
        self.units.on_change(lambda *_: self.admission.wake_all())
        self.upstream = UpstreamClient(config)
        self.signals = Signals()
        self.seen = Recorder(self.admission)
        self.signals.subscribe(self.seen)
        self.dispatcher = Dispatcher(
            config,
            self.units,
            self.admission,
            self.upstream,
            self.signals,
            Random(seed),
            forecast=forecast,
        )
        self._made = 0

    def call(self, stream: bool = True, within: float | None = None) -> Call:
        """A validated call, as intake leaves it; `within`: seconds to its deadline."""
        self._made += 1
        now = asyncio.get_running_loop().time()
        deadline = now + (self.config.timeouts.total if within is None else within)
        call = Call(CHAT_PATH, f"r{self._made}", {}, now, deadline, Lease(self.admission))
        data = chat_body(stream)
        body = orjson.dumps(data)
        call.accept(RequestInfo(MODEL, stream, None, ""), None, None, body, {})
        return call

    def available(self) -> float:
        return self.dispatcher.budget.available(asyncio.get_running_loop().time())

    def unit(self, unit_id: str) -> UnitState:
        return self.units.units[unit_id]


Make = Callable[..., Rig]


@pytest.fixture
async def rigs() -> AsyncIterator[Make]:
    """Builds Rigs from (id, leader, weight) triples and config sections; closes them after."""
    made: list[Rig] = []

    def make(
        units: list[tuple[str, str, float]],
        seed: int = 7,
        forecast: Forecast | None = None,
        **sections: Any,
    ) -> Rig:
        defaults: dict[str, dict[str, Any]] = {
            # Small timeouts; ratio 0 makes the budget's arithmetic exact: `floor` retries
            # (budget_min_per_second x the 10 s window), whatever the deposits.
            "timeouts": {"connect": 0.5, "first_byte": 1.0, "total": 5.0},
            "retry": {"budget_ratio": 0.0, "budget_min_per_second": 1.0},
        }
        for name, values in defaults.items():
            sections[name] = {**values, **sections.get(name, {})}
        config = gateway_config(
            [{"id": i, "leader": url, "nodes": [url]} for i, url, _ in units], **sections
        )
        weights = {i: w for i, _, w in units}
        config = replace(
            config, units=tuple(replace(u, weight=weights[u.id]) for u in config.units)
        )
        made.append(Rig(config, seed, forecast))
        return made[-1]

    yield make
    for rig in made:
        await rig.upstream.close()


def answering(hits: list[str], status: int = 200) -> web.Application:
    """A leader answering both endpoints: SSE to a stream, JSON otherwise, or `status` bare."""

    async def answer(request: web.Request) -> web.Response:
        data = await request.json()
        hits.append(request.path)
        if status != 200:
            return web.Response(status=status, text="engine overloaded")
        if data.get("stream"):
            return web.Response(body=FIRST, content_type="text/event-stream")
        return web.json_response({"choices": [{"text": "hi"}]})

    app = web.Application()
    app.router.add_post(CHAT_PATH, answer)
    app.router.add_post(COMPLETIONS_PATH, answer)
    return app


@contextlib.contextmanager
def refused(n: int) -> Iterator[list[str]]:
    """`n` ports where nothing listens."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(refused_url()) for _ in range(n)]
