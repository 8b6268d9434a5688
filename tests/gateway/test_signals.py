"""The request path's signals: fan-out to observers, and the breakers' feed classifying."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import UnitConfig
from gateway.errors import UpstreamError
from gateway.health.feed import BreakerFeed
from gateway.observability.histogram import Histogram
from gateway.outcomes import End, Failure
from gateway.paths import COMPLETIONS_PATH
from gateway.proxy.call import Call
from gateway.proxy.lease import Lease
from gateway.routing.admission import Admission
from gateway.signals import DISCARD, Observer, Signals
from gateway.units import UnitState

UNIT = UnitState(UnitConfig(id="u0", leader="http://127.0.0.1:1"), 8, ("m",))


def call(start: float = 0.0) -> Call:
    return Call(COMPLETIONS_PATH, "r1", {}, start, start + 60, Lease(Admission(8, 1.0, 1)))


class Seen(Observer):
    def __init__(self, name: str, log: list[str], sink: Histogram | None = None) -> None:
        self.name, self.log, self.sink = name, log, sink

    def rejected(self, call: Call, code: str) -> None:
        self.log.append(f"{self.name}:{code}")

    def token_gaps(self, unit_id: str) -> Histogram | None:
        return self.sink


def test_every_subscriber_hears_every_signal_in_order() -> None:
    log: list[str] = []
    signals = Signals()
    assert signals.token_gaps("u0") is DISCARD  # nobody records gaps: they are dropped
    sink = Histogram()
    signals.subscribe(Seen("a", log))
    signals.subscribe(Seen("b", log, sink))
    signals.rejected(call(), "saturated")
    signals.ended(call())  # a hook nobody overrides does nothing
    assert log == ["a:saturated", "b:saturated"]
    assert signals.token_gaps("u0") is sink


def test_every_hook_is_fanned_out_to_exactly_the_observers_that_implement_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Signals calls each hook only on the subscribers that override it (inherited overrides
    count): Observer's own no-ops are never called, and no hook is left out of the fan-out."""
    from gateway import signals as module

    hooks = {n for n, v in vars(Observer).items() if callable(v) and not n.startswith("_")}
    assert hooks - {"token_gaps"} == set(module._HOOKS)
    noops: list[str] = []
    for name in module._HOOKS:
        monkeypatch.setattr(Observer, name, lambda self, *a, _n=name: noops.append(_n))
    log: list[str] = []

    class Inherits(Seen):  # its `rejected` comes from Seen
        def ended(self, call: Call) -> None:
            log.append(f"{self.name}:ended")

    signals = Signals()
    signals.subscribe(Seen("a", log))
    signals.subscribe(Inherits("b", log))
    signals.rejected(call(), "saturated")
    signals.ended(call())
    signals.received(call())
    assert log == ["a:saturated", "b:saturated", "b:ended"]
    assert noops == []


def feed(flowing: bool) -> tuple[BreakerFeed, list[bool]]:
    recorded: list[bool] = []
    return (
        BreakerFeed(lambda unit, ok, started: recorded.append(ok), lambda u, t: flowing, 30, 4),
        recorded,
    )


async def test_the_breakers_feed_passes_on_only_what_the_unit_caused() -> None:
    assert asyncio.get_running_loop()  # the feed reads the loop's clock
    timeout = UpstreamError("u0", Failure.CONNECT_TIMEOUT, "connect timed out", retryable=True)
    refused = UpstreamError("u0", Failure.CONNECT, "refused", retryable=True)
    busy, recorded = feed(flowing=True)
    busy.attempt_failed(call(), UNIT, timeout, 0.0)  # its queue, while its streams flow
    busy.attempt_failed(call(), UNIT, refused, 0.0)
    busy.answer_ended(call(), UNIT, End.UNIT_EJECTED, 0.02)  # the gateway broke it
    busy.answer_ended(call(), UNIT, End.CLIENT_GONE, 0.02)
    busy.answer_ended(call(), UNIT, End.RESET, 0.02)
    busy.answer_ended(call(), UNIT, End.COMPLETE, None)
    assert recorded == [False, False, True]
    quiet, recorded = feed(flowing=False)
    quiet.attempt_failed(call(), UNIT, timeout, 0.0)  # nothing vouches for it: a failure
    assert recorded == [False]
