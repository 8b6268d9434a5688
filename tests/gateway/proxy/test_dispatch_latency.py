"""The dispatcher with a latency forecast: requests go to the unit predicted to answer
soonest, each attempt's placement is left on the call for the forecast's feed, and a class
whose TTFT target no unit is predicted to meet is shed when it asks to be."""

from __future__ import annotations

import pytest

from gateway.errors import Overloaded
from gateway.routing.admission import Ask
from gateway.routing.forecast import Forecast, Placed
from tests.gateway.proxy import dispatch_support
from tests.gateway.proxy.dispatch_support import HEAVY, Make, answering
from tests.gateway.servers import serve_app

rigs = dispatch_support.rigs


def learned(ttft: dict[str, float], least: int = 5) -> Forecast:
    """A forecast that has seen `least` answers of each unit, each after `ttft[unit]` s."""
    forecast = Forecast(least=least, learn_every=0.0)
    now = 100.0
    for unit, seconds in ttft.items():
        for i in range(least):
            placed = Placed(unit, 100 + 10 * i, 0, None)
            forecast.sent(placed, 0, now)
            forecast.first_token(placed, now + seconds)
            forecast.finished(placed, 0.01, now + seconds + 0.5)
            now += 1.0
    return forecast


async def test_observing_the_forecast_leaves_routing_as_it_was(rigs: Make) -> None:
    """`latency_model = "observe"` (the default): the prediction is made and left on the
    call for the metrics, and the unit is picked as without a forecast."""
    async with serve_app(answering([])) as a, serve_app(answering([])) as b:
        forecast = learned({"a": 0.4, "b": 0.05})
        rig = rigs([("a", a, HEAVY), ("b", b, HEAVY)], forecast=forecast)
        served = set()
        for _ in range(12):  # by load alone, twelve in a row to b is one chance in 4,096
            call = rig.call()
            with call.lease:
                unit, answer = await rig.dispatcher.open(call)
                served.add(unit.id)
                assert call.placed is not None and call.placed.predicted is not None
                assert call.routed == "load"
                rig.upstream.finish(answer)
        assert served == {"a", "b"}


async def test_the_unit_predicted_soonest_gets_the_request(rigs: Make) -> None:
    async with serve_app(answering([])) as a, serve_app(answering([])) as b:
        # seed 7 explores on none of these picks (EXPLORE: 5% go by load alone)
        rig = rigs(
            [("a", a, HEAVY), ("b", b, HEAVY)],
            forecast=learned({"a": 0.4, "b": 0.05}),
            routing={"latency_model": "route"},
        )
        for _ in range(5):
            call = rig.call()
            with call.lease:
                unit, answer = await rig.dispatcher.open(call)
                assert unit.id == "b"
                placed = call.placed
                assert placed is not None and placed.unit == "b"
                assert placed.predicted == pytest.approx(0.05, rel=0.05)
                assert placed.prompt > 0 and placed.cached == 0  # estimated from its bytes
                assert call.routed == "predicted"
                rig.upstream.finish(answer)


@pytest.mark.parametrize("shed", [True, False])
async def test_a_target_no_unit_meets_sheds_the_request_or_takes_the_soonest(
    rigs: Make, shed: bool
) -> None:
    classes = [
        {"name": "interactive", "rank": 0, "ttft_slo": 0.1, "shed_on_slo": shed},
        {"name": "standard", "rank": 1},
    ]
    async with serve_app(answering([])) as a, serve_app(answering([])) as b:
        forecast = learned({"a": 0.4, "b": 0.3})
        rig = rigs(
            [("a", a, HEAVY), ("b", b, HEAVY)],
            forecast=forecast,
            priority={"classes": classes, "default": "standard"},
            routing={"latency_model": "route"},
        )
        call = rig.call()
        call.lease.ask = Ask("interactive")
        with call.lease:
            if shed:
                with pytest.raises(Overloaded) as caught:
                    await rig.dispatcher.open(call)
                assert caught.value.status == 429 and caught.value.code == "ttft_slo"
                assert "0.1 s" in str(caught.value) and caught.value.retry_after >= 1
                assert rig.seen.named("rejected") == [("rejected", "ttft_slo")]
                assert rig.admission.inflight == 0
            else:
                unit, answer = await rig.dispatcher.open(call)
                assert unit.id == "b"  # the soonest of two that both miss
                rig.upstream.finish(answer)
        # The standard class has no target: never shed.
        call = rig.call()
        with call.lease:
            unit, answer = await rig.dispatcher.open(call)
            rig.upstream.finish(answer)
