"""What the dispatcher's retries and resumptions pay from the retry budget (the harness of
test_dispatch.py, in tests/gateway/proxy/dispatch_support.py): an empty budget refuses the
retry, and a resumption pays once per cause, nothing when the gateway itself broke the stream."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import Overloaded, UpstreamError
from gateway.outcomes import Failure
from gateway.paths import CHAT_PATH, COMPLETIONS_PATH
from gateway.proxy.call import Call
from tests.gateway.proxy import dispatch_support
from tests.gateway.proxy.dispatch_support import HEAVY, LIGHT, Make, answering, refused
from tests.gateway.servers import serve_app
from tests.support import MODEL

# The shared fixture (dispatch_support.rigs), registered in this module: the prober tests
# have a `rigs` of their own, so it cannot live in tests/gateway/conftest.py.
rigs = dispatch_support.rigs


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
