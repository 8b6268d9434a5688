"""The dispatcher built on its own (no gateway, no handler): a real UnitRegistry, Admission,
UpstreamClient and Signals around it, real leaders on 127.0.0.1 (OS-assigned ports), and a
recording observer. What one call's attempts are (one on the happy path; a retryable
failure retried on a unit not yet tried, paid from the retry budget; a non-retryable one, the
attempt limit, no unit left or an empty budget stop), what a resumption pays, which admission
slot is held, and which first-byte deadline an attempt gets."""

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
from gateway.errors import Overloaded, UpstreamError
from gateway.outcomes import Failure
from gateway.proxy.call import CHAT_PATH, COMPLETIONS_PATH, Call
from gateway.proxy.dispatch import Dispatcher
from gateway.proxy.lease import Lease
from gateway.proxy.signals import Observer, Signals
from gateway.proxy.upstream import Answer, UpstreamClient
from gateway.proxy.validation import RequestInfo
from gateway.routing.admission import Admission
from gateway.units import UnitRegistry, UnitState
from tests.gateway.servers import Peer, RawServer, never, refused_url, serve_app, until
from tests.support import MODEL, chat_body, gateway_config

FIRST = b'data: {"n": 1}\n\n'
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
JSON_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"

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

    def rejected(self, code: str) -> None:
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

    def __init__(self, config: Config, seed: int = 7) -> None:
        self.config = config
        self.units = UnitRegistry(config)
        a = config.admission
        self.admission = Admission(a.queue_size, a.queue_timeout, a.retry_after)
        self.units.on_change(lambda *_: self.admission.wake_all())
        self.upstream = UpstreamClient(config)
        self.signals = Signals()
        self.seen = Recorder(self.admission)
        self.signals.subscribe(self.seen)
        self.dispatcher = Dispatcher(
            config, self.units, self.admission, self.upstream, self.signals, Random(seed)
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
        call.accept(body, data, RequestInfo(MODEL, stream, None, ""), None, None, body)
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

    def make(units: list[tuple[str, str, float]], seed: int = 7, **sections: Any) -> Rig:
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
        made.append(Rig(config, seed))
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


@pytest.mark.parametrize("stream", [True, False])
async def test_the_happy_path_is_one_attempt_and_its_lease_holds_the_unit(
    rigs: Make, stream: bool
) -> None:
    a_hits: list[str] = []
    b_hits: list[str] = []
    async with serve_app(answering(a_hits)) as a, serve_app(answering(b_hits)) as b:
        rig = rigs([("a", a, HEAVY), ("b", b, HEAVY)])
        call = rig.call(stream)
        with call.lease:
            unit, answer = await rig.dispatcher.open(call)
            assert rig.seen.events == [("started", unit.id, 1), ("opened", unit.id, 200)]
            assert call.attempts == 1 and call.tried == [] and call.last_error is None
            assert answer.status == 200 and answer.streaming is stream
            whole = {"choices": [{"text": "hi"}]}
            assert answer.first == FIRST if stream else orjson.loads(answer.first) == whole
            # The lease holds the serving unit's slot, and only that one.
            assert call.lease.unit is unit
            assert unit.inflight == 1 and rig.admission.inflight == 1
            assert rig.units.total_inflight() == 1
            assert sorted([a_hits, b_hits]) == [[], [CHAT_PATH]]
            assert rig.available() == 10.0  # nothing was withdrawn
            rig.upstream.finish(answer)
        assert rig.admission.inflight == 0 and unit.inflight == 0


async def test_a_retryable_failure_is_retried_on_units_not_yet_tried(rigs: Make) -> None:
    status_hits: list[str] = []
    ok_hits: list[str] = []
    with refused(1) as (dead,):
        async with (
            serve_app(answering(status_hits, 503)) as failing,
            serve_app(answering(ok_hits)) as good,
        ):
            # The good unit is the picker's last choice: both failing units come first.
            rig = rigs([("dead", dead, HEAVY), ("5xx", failing, HEAVY), ("ok", good, LIGHT)])
            call = rig.call()
            with call.lease:
                unit, answer = await rig.dispatcher.open(call)
                assert unit.id == "ok" and call.lease.unit is unit
                tried = [u.id for u in call.tried]
                assert sorted(tried) == ["5xx", "dead"]  # each once: never the same unit again
                assert rig.seen.started() == [*tried, "ok"]
                assert call.attempts == 3
                kinds = {"dead": Failure.CONNECT, "5xx": Failure.STATUS}
                assert rig.seen.named("failed") == [("failed", u, kinds[u]) for u in tried]
                assert rig.seen.named("retried") == [("retried", kinds[u]) for u in tried]
                assert rig.seen.named("opened") == [("opened", "ok", 200)]
                assert rig.available() == 10.0 - 2  # each retry paid once from the budget
                assert (len(status_hits), len(ok_hits)) == (1, 1)
                # A failed attempt gave its slot back before the next one took another.
                assert rig.seen.held_at_start == [1, 1, 1]
                assert rig.admission.inflight == 1
                rig.upstream.finish(answer)
            assert rig.admission.inflight == 0 and rig.units.total_inflight() == 0


async def test_a_non_retryable_failure_is_not_retried(rigs: Make) -> None:
    """The gateway's own connection limit ran out (Failure.LOCAL): no evidence against the
    unit, and another unit would wait alike."""

    def hold(peer: Peer, request: bytes) -> None:
        peer.write(SSE_HEAD + b"%x\r\n%b\r\n" % (len(FIRST), FIRST))  # and never ends

    async with RawServer(hold) as a, RawServer(hold) as b:
        rig = rigs(
            [("a", a.url, HEAVY), ("b", b.url, HEAVY)],
            upstream={"max_connections": 1},
            timeouts={"first_byte": 0.1},
        )
        holder = rig.call()
        with holder.lease:
            _, held = await rig.dispatcher.open(holder)  # holds the one connection
            rig.seen.events.clear()
            call = rig.call()
            with call.lease:
                with pytest.raises(UpstreamError) as caught:
                    await rig.dispatcher.open(call)
                assert caught.value.kind is Failure.LOCAL and not caught.value.retryable
                assert call.attempts == 1
                assert [e[0] for e in rig.seen.events] == ["started", "failed"]
                assert rig.available() == 10.0  # nothing paid for a retry not made
                assert call.lease.unit is None
                assert rig.admission.inflight == 1  # the holder's only
            rig.upstream.finish(held)
        assert rig.admission.inflight == 0
        assert len(a.peers) + len(b.peers) == 1  # the second call never reached a unit


@pytest.mark.parametrize("max_attempts", [1, 2])
async def test_max_attempts_stops_the_retries(rigs: Make, max_attempts: int) -> None:
    with refused(3) as urls:
        rig = rigs(
            [(f"u{i}", url, HEAVY) for i, url in enumerate(urls)],
            retry={"max_attempts": max_attempts},
        )
        call = rig.call()
        with call.lease:
            with pytest.raises(UpstreamError) as caught:
                await rig.dispatcher.open(call)
            assert call.attempts == max_attempts
            assert len({u.id for u in call.tried}) == max_attempts  # distinct units
            assert caught.value is call.last_error  # the last attempt's failure
            assert caught.value.unit_id == call.tried[-1].id
            assert len(rig.seen.named("retried")) == max_attempts - 1
            assert rig.available() == 10.0 - (max_attempts - 1)
            assert rig.admission.inflight == 0  # given back by the failed attempt itself
        assert rig.units.total_inflight() == 0


async def test_every_unit_tried_raises_the_last_failure(rigs: Make) -> None:
    hits: list[str] = []
    with refused(1) as (dead,):
        async with serve_app(answering(hits, 502)) as failing:
            rig = rigs([("dead", dead, HEAVY), ("5xx", failing, HEAVY)], retry={"max_attempts": 5})
            call = rig.call()
            with call.lease:
                with pytest.raises(UpstreamError) as caught:
                    await rig.dispatcher.open(call)
                assert call.attempts == 2  # not max_attempts: no unit was left
                last = call.tried[-1]
                assert caught.value is call.last_error and caught.value.unit_id == last.id
                expected = {"dead": Failure.CONNECT, "5xx": Failure.STATUS}[last.id]
                assert caught.value.kind is expected
                assert len(rig.seen.named("retried")) == 1
                # Nowhere else to go: the budget is not spent, nor said to be exhausted.
                assert rig.available() == 10.0 - 1
                assert rig.seen.named("budget_exhausted") == []
                assert rig.admission.inflight == 0
            assert rig.units.total_inflight() == 0


async def test_a_unit_gone_before_the_retry_is_admitted_leaves_the_last_failure(
    rigs: Make,
) -> None:
    """The retry was decided while another unit was routable; by its admission none is left
    untried: the client gets the unit's failure, not a 503 `no_routable_unit`."""
    hits: list[str] = []
    with refused(1) as (dead,):
        async with serve_app(answering(hits)) as good:
            rig = rigs([("dead", dead, HEAVY), ("ok", good, LIGHT)])
            rig.seen.on_retried = lambda: rig.units.set_bit("ok", "enabled", False)
            call = rig.call()
            with call.lease:
                with pytest.raises(UpstreamError) as caught:
                    await rig.dispatcher.open(call)
                assert caught.value.kind is Failure.CONNECT and caught.value.unit_id == "dead"
                assert call.attempts == 1 and rig.seen.started() == ["dead"]
                assert rig.seen.named("rejected") == [] and hits == []
                assert rig.admission.inflight == 0


async def test_no_routable_unit_is_a_503(rigs: Make) -> None:
    hits: list[str] = []
    async with serve_app(answering(hits)) as good:
        rig = rigs([("a", good, HEAVY), ("b", good, HEAVY)], admission={"retry_after": 3})
        for unit_id in ("a", "b"):
            rig.units.set_bit(unit_id, "enabled", False)
        call = rig.call()
        with call.lease, pytest.raises(Overloaded) as caught:
            await rig.dispatcher.open(call)
        error = caught.value
        assert (error.status, error.code, error.retry_after) == (503, "no_routable_unit", 3)
        assert rig.seen.events == [("rejected", "no_routable_unit")]
        assert call.attempts == 0 and hits == []
        assert rig.admission.inflight == 0


async def test_an_exhausted_budget_refuses_the_retry(rigs: Make) -> None:
    hits: list[str] = []
    with refused(1) as (dead,):
        async with serve_app(answering(hits)) as good:
            # A budget of exactly one retry (0.1 per second over the 10 s window).
            rig = rigs(
                [("dead", dead, HEAVY), ("ok", good, LIGHT)],
                retry={"budget_min_per_second": 0.1},
            )
            first = rig.call()
            with first.lease:
                unit, answer = await rig.dispatcher.open(first)  # its retry spends the budget
                assert unit.id == "ok" and first.attempts == 2
                rig.upstream.finish(answer)
            assert rig.available() == 0
            rig.seen.events.clear()
            second = rig.call()
            with second.lease:
                with pytest.raises(UpstreamError) as caught:
                    await rig.dispatcher.open(second)
                assert caught.value.kind is Failure.CONNECT and second.attempts == 1
                assert rig.seen.events == [
                    ("started", "dead", 1),
                    ("failed", "dead", Failure.CONNECT),
                    ("budget_exhausted",),
                ]
                assert hits == [CHAT_PATH]  # the first call's; the second never got there
                assert rig.admission.inflight == 0


async def test_a_resumption_pays_once_per_cause_and_nothing_when_the_gateway_broke_it(
    rigs: Make,
) -> None:
    hits: list[str] = []
    with refused(1) as (broken,):
        async with serve_app(answering(hits)) as good:
            # The broken unit is the picker's favourite: only `tried` keeps it out.
            rig = rigs(
                [("broken", broken, LIGHT * 4), ("ok", good, LIGHT)],
                retry={"budget_min_per_second": 0.1},
            )
            continuation = orjson.dumps({"model": MODEL, "prompt": [1, 2, 3], "stream": True})

            async def resume(cause: tuple[str, str] | None) -> Call:
                call = rig.call()
                call.continue_with(continuation, rig.unit("broken"))
                with call.lease:
                    unit, answer = await rig.dispatcher.resume(call, cause)
                    assert unit.id == "ok" and call.lease.unit is unit
                    assert [u.id for u in call.tried] == ["broken"] and call.attempts == 1
                    rig.upstream.finish(answer)
                return call

            await resume(("broken", "reset"))
            assert rig.available() == 0  # the first stream the cause broke paid
            await resume(("broken", "reset"))  # the same cause: rides on that payment
            assert rig.seen.named("budget_exhausted") == []
            with pytest.raises(Overloaded) as caught:
                await resume(("broken", "idle_timeout"))  # a new cause, nothing left to pay
            assert (caught.value.status, caught.value.code) == (503, "retry_budget_exhausted")
            assert rig.seen.named("budget_exhausted") == [("budget_exhausted",)]
            await resume(None)  # the gateway broke it (ejection): free
            assert len(rig.seen.named("budget_exhausted")) == 1
            assert hits == [COMPLETIONS_PATH] * 3
            assert rig.seen.started() == ["ok"] * 3
            assert rig.admission.inflight == 0 and rig.units.total_inflight() == 0


async def test_a_cancelled_attempt_gives_its_slot_back_and_is_no_unit_failure(
    rigs: Make,
) -> None:
    async with RawServer(never) as silent:
        rig = rigs([("a", silent.url, HEAVY)])
        call = rig.call()
        with call.lease:
            task = asyncio.create_task(rig.dispatcher.open(call))
            await until(lambda: bool(silent.peers and silent.peers[0].requests), 1.0, "sent")
            assert rig.admission.inflight == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert rig.admission.inflight == 0 and call.lease.unit is None
            assert call.tried == [] and call.last_error is None
            assert [e[0] for e in rig.seen.events] == ["started"]  # not failed, not retried
        await asyncio.wait_for(silent.peers[0].closed.wait(), 1.0)  # the unit sees it go


def answer_after(delay: float) -> Callable[[Peer, bytes], None]:
    def answer(peer: Peer, request: bytes) -> None:
        asyncio.get_running_loop().call_later(delay, peer.write, JSON_OK)

    return answer


async def open_timed(rig: Rig, call: Call) -> tuple[float, Answer | UpstreamError]:
    loop = asyncio.get_running_loop()
    start = loop.time()
    with call.lease:
        try:
            _, answer = await rig.dispatcher.open(call)
        except UpstreamError as exc:
            return loop.time() - start, exc
    return loop.time() - start, answer


async def test_a_stream_has_first_byte_to_its_first_byte_and_a_whole_answer_total(
    rigs: Make,
) -> None:
    """A non-streamed answer's first byte comes when it is complete: only `total` bounds it."""
    async with RawServer(answer_after(0.3)) as slow:
        rig = rigs(
            [("a", slow.url, HEAVY)],
            timeouts={"first_byte": 0.1, "total": 2.0},
            retry={"max_attempts": 1},
        )
        stream = rig.call(stream=True)
        took, got = await open_timed(rig, stream)
        assert stream.first_byte == 0.1
        # Timed out at first_byte: with `total` the answer (at 0.3 s) would have come in time.
        assert isinstance(got, UpstreamError) and got.kind is Failure.FIRST_BYTE_TIMEOUT
        assert 0.09 <= took < 1.0

        whole = rig.call(stream=False)
        took, got = await open_timed(rig, whole)
        assert whole.first_byte == 2.0
        assert isinstance(got, Answer) and got.first == b"{}"
        assert took >= 0.29
        assert rig.admission.inflight == 0


async def test_the_first_byte_deadline_never_passes_the_calls_own(rigs: Make) -> None:
    async with RawServer(answer_after(0.5)) as slow:
        rig = rigs([("a", slow.url, HEAVY)], retry={"max_attempts": 1})
        call = rig.call(stream=True, within=0.1)  # what is left of the request's total time
        took, got = await open_timed(rig, call)
        assert call.first_byte == 1.0
        # At the call's deadline: by first_byte (1 s) the answer (at 0.5 s) would have come.
        assert isinstance(got, UpstreamError) and got.kind is Failure.FIRST_BYTE_TIMEOUT
        assert 0.09 <= took < 1.0
