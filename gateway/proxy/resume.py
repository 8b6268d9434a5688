"""Resumption, the phase after a stream broke past its first byte: continue it, or end it.

The tracker knows the prompt ids and the tokens the client already has; the dispatcher opens
a continuation (continuation.py builds its body) on a unit not yet tried, paid from the retry
budget once per cause. When the stream cannot go on (the request or the unit does not allow
it, the resume limit, the budget, no unit left) it is ended here with an explicit SSE error
event and [DONE], never a silent truncation; a stream that only missed its closing is closed.

The broken unit's admission slot is given back before the continuation waits for another, so
a resumed stream never holds two slots.
"""

from __future__ import annotations

from gateway.errors import GatewayError
from gateway.outcomes import End, Resumption
from gateway.proxy.call import Call
from gateway.proxy.context import ProxyContext
from gateway.proxy.continuation import continuation, max_new_tokens
from gateway.proxy.relay import StreamRelay
from gateway.proxy.upstream import Answer
from gateway.relay.tracker import StreamTracker
from gateway.units import UnitState


async def resume(
    proxy: ProxyContext, call: Call, relay: StreamRelay, end: End
) -> tuple[UnitState, Answer] | None:
    """The continuation's unit and answer (the call now served by it), or None once the
    stream is ended: closed cleanly or with an error event."""
    broken, tracker = call.unit, call.tracker
    assert broken is not None and call.lease.unit is broken
    call.lease.drop()
    if tracker is None or end is End.TOTAL_TIMEOUT:
        await relay.fail(end)
        return None
    if tracker.finish_reason is not None:  # only the usage chunk and [DONE] were missing
        await _close(relay, tracker.closing())
        return None
    refusal = _refusal(proxy, call, tracker, broken)
    if refusal is not None:
        await relay.fail(end, refusal)
        return None
    total = max_new_tokens(call.carried, tracker.chat)
    remaining = None if total is None else total - tracker.committed
    if remaining is not None and remaining <= 0:  # every token was relayed but the finish
        await _close(relay, tracker.closing("length"))
        return None
    prompt = tracker.resume_point()
    assert prompt is not None  # capable units gave their prompt ids
    call.continue_with(
        continuation(call.carried, call.info.model, prompt, remaining, tracker.committed), broken
    )
    try:
        cause = None if end is End.UNIT_EJECTED else (broken.id, end.value)
        unit, answer = await proxy.dispatcher.resume(call, cause)
    except GatewayError as exc:
        proxy.signals.resumed(
            call, broken, Resumption.GAVE_UP, f"{end}: no continuation ({exc.detail})"
        )
        await relay.fail(end, exc.client_message())
        return None
    if not answer.streaming or answer.status != 200:  # refused: a 4xx, or not a stream
        call.lease.drop()
        proxy.upstream.finish(answer)  # a streamed refusal's connection is not left open
        detail = f"unit {unit.id} answered HTTP {answer.status}: {_excerpt(answer.first)}"
        proxy.signals.resumed(call, broken, Resumption.GAVE_UP, f"{end}: {detail}")
        await relay.fail(end, f"the continuation was refused (HTTP {answer.status})")
        return None
    tracker.begin_continuation()
    call.unit = unit
    detail = f"{end}: continued on {unit.id} after {tracker.committed} tokens"
    proxy.signals.resumed(call, broken, Resumption.OK, detail)
    return unit, answer


def _refusal(
    proxy: ProxyContext, call: Call, tracker: StreamTracker, broken: UnitState
) -> str | None:
    if not tracker.capable:
        proxy.signals.resumed(
            call, broken, Resumption.UNSUPPORTED, "the unit returned no token ids"
        )
        return "its unit returns no token ids"
    limit = proxy.config.resume.max_resumes
    if tracker.resumes >= limit:
        proxy.signals.resumed(call, broken, Resumption.GAVE_UP, f"resume limit ({limit}) reached")
        return f"the stream was already resumed {tracker.resumes} time(s)"
    return None


async def _close(relay: StreamRelay, tail: bytes) -> None:
    if await relay.write(tail):
        await relay.finish()


def _excerpt(body: bytes) -> str:
    return body[:200].decode("utf-8", "replace")
