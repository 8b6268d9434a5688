"""The dispatcher built on its own (no gateway, no handler): a real UnitRegistry, Admission,
UpstreamClient and Signals around it, real leaders on 127.0.0.1 (OS-assigned ports), and a
recording observer (tests/gateway/proxy/dispatch_support.py). What one call's attempts are (one on
the happy path; a retryable failure retried on a unit not yet tried; a non-retryable one, the
attempt limit or no unit left stop), which admission slot is held, and what a cancelled attempt
leaves. The retry budget: test_dispatch_budget.py; first-byte deadlines:
test_dispatch_deadlines.py."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from gateway.errors import Overloaded, UpstreamError
from gateway.outcomes import Failure
from gateway.paths import CHAT_PATH
from tests.gateway.proxy import dispatch_support
from tests.gateway.proxy.dispatch_support import FIRST, HEAVY, LIGHT, Make, answering, refused
from tests.gateway.servers import Peer, RawServer, never, serve_app, until

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


# The shared fixture (dispatch_support.rigs), registered in this module: the prober tests
# have a `rigs` of their own, so it cannot live in tests/gateway/conftest.py.
rigs = dispatch_support.rigs


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
            assert call.send_body == b""  # answered: not kept for the stream's life
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
