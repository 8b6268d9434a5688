"""The relay phase: a streamed answer from first byte to end, resumed when its unit breaks.

Before the first byte, failures are the dispatcher's to retry. After it, an answer that
breaks (reset, leader died, idle between tokens, the unit ejected by its probes, an error
event, a body that ends without [DONE]) goes to the resumption phase (resume.py), which
either hands back a continuation on another unit, spliced into the same client stream by the
same relay, or ends the stream.

While an answer is relayed its stream is registered as live on its unit (live.py): that is
how an ejection reaches it and how its pace vouches for a slow unit.
"""

from __future__ import annotations

from gateway.outcomes import End
from gateway.proxy.call import Call
from gateway.proxy.context import ProxyContext
from gateway.proxy.exchange import Exchange
from gateway.proxy.relay import StreamRelay
from gateway.proxy.resume import resume
from gateway.proxy.upstream import Answer
from gateway.relay.usage import Usage, UsageReader
from gateway.units import UnitState


def headers_for(unit: UnitState, call: Call) -> dict[str, str]:
    """The answer's own headers: who served it, its id, and its key's x-ratelimit-*."""
    headers = {"x-unitgate-unit": unit.id, "x-request-id": call.rid}
    if call.grant is not None:
        headers.update(call.grant.headers())
    return headers


async def relay_stream(proxy: ProxyContext, request: Exchange, call: Call, answer: Answer) -> None:
    unit = call.unit
    assert unit is not None
    relay = StreamRelay(
        request,
        headers_for(unit, call),
        call.deadline,
        proxy.config.timeouts.idle,
        proxy.upstream.timers,
        call.tracker,
        (proxy.config.resume.ejected_idle, proxy.config.health.pace_factor),
        # A stream that is never resumed has one answer: its own events say its usage.
        UsageReader() if call.tracker is None else None,
    )
    first = True
    while True:  # one answer, then each continuation of it, in this one coroutine (a helper
        # coroutine per answer would be one more frame held by every open stream)
        proxy.live.add(unit.id, relay)
        end = End.CLIENT_GONE
        try:
            if not first or await relay.start(answer):
                gaps = proxy.signals.token_gaps(unit.id)
                end = await relay.pump(answer, gaps)
        finally:
            proxy.live.discard(unit.id, relay)
            proxy.upstream.finish(answer)  # closes the connection unless it ended cleanly
        _ended(proxy, call, relay, unit, end)
        if end is End.COMPLETE or end is End.CLIENT_GONE:
            break
        nxt = await resume(proxy, call, relay, end)
        if nxt is None:  # the stream was ended: closed cleanly or with an error event
            break
        unit, answer = nxt
        first = False
    call.usage = _usage(call, relay)
    if end is End.COMPLETE:
        await relay.finish()


def _usage(call: Call, relay: StreamRelay) -> Usage | None:
    """A resumable stream's tokens are counted by its tracker from the ids the units sent
    (whether the client asked for usage or not, over every continuation); any other
    stream's are what its own events said."""
    tracker = call.tracker
    if tracker is not None:
        if not tracker.capable or tracker.prompt_ids is None:
            return None
        cached = tracker.cached if not tracker.resumes else None  # the first unit's
        return Usage(len(tracker.prompt_ids), tracker.produced, cached)
    return relay.usage.usage if relay.usage is not None else None


def _ended(proxy: ProxyContext, call: Call, relay: StreamRelay, unit: UnitState, end: End) -> None:
    """One answer has ended: say how (to the signals, and the call)."""
    call.end = end
    if call.tracker is not None and call.tracker.capable is not None:
        unit.token_ids = call.tracker.capable
    proxy.signals.answer_ended(call, unit, end, relay.gap)
