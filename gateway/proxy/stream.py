"""A streamed answer from first byte to end, continued on another unit when its unit breaks.

Before the first byte, failures are the dispatcher's to retry. After it, a broken stream
(reset, leader died, idle between tokens, the unit ejected by its probes, an error event,
a body that ends without [DONE]) is resumed: the tracker knows the prompt ids and the tokens
the client already has, the dispatcher opens a continuation on a unit not yet tried (paid
from the retry budget), and the relay splices it into the same client stream. When it cannot
(the request or the unit does not allow it, the resume limit, the budget, no unit left) the
client gets an explicit SSE error event and [DONE], never a silent truncation.

The request's lease (lease.py) holds the admission slot of whichever unit serves it at the
moment, so a resumed stream never holds two slots, or none while it is relayed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from gateway.errors import GatewayError
from gateway.outcomes import End
from gateway.proxy.context import ProxyContext
from gateway.proxy.dispatch import Call
from gateway.proxy.relay import StreamRelay
from gateway.proxy.resume import continuation, max_new_tokens
from gateway.proxy.tracker import StreamTracker
from gateway.proxy.upstream import Answer
from gateway.units import UnitState

COMPLETIONS_PATH = "/v1/completions"


def headers_for(unit: UnitState, rid: str) -> dict[str, str]:
    return {"x-unitgate-unit": unit.id, "x-request-id": rid}


class StreamSession:
    def __init__(
        self,
        proxy: ProxyContext,
        request: web.Request,
        call: Call,
        data: dict[str, Any],
        tracker: StreamTracker | None,
        start: float,
    ) -> None:
        self.proxy, self.request, self.call, self.data = proxy, request, call, data
        self.tracker, self.start = tracker, start

    async def run(self, unit: UnitState, answer: Answer) -> web.StreamResponse:
        proxy, call = self.proxy, self.call
        relay = StreamRelay(
            self.request,
            headers_for(unit, call.rid),
            call.deadline,
            proxy.config.timeouts.idle,
            self.tracker,
            (proxy.live.floor, proxy.live.factor),
        )
        try:
            kind = await self._relay(relay, unit, answer, first=True)
            while kind is not End.COMPLETE and kind is not End.CLIENT_GONE:
                nxt = await self._resume(relay, unit, kind)
                if nxt is None:  # the stream was ended: closed cleanly or with an error event
                    break
                unit, answer = nxt
                kind = await self._relay(relay, unit, answer, first=False)
            if kind is End.COMPLETE:
                await relay.finish()
            assert relay.response is not None
            return relay.response
        finally:
            proxy.finished(unit.id, answer.status, self.start)

    async def _relay(self, relay: StreamRelay, unit: UnitState, answer: Answer, first: bool) -> End:
        """Relay one answer to its end (registered as live on its unit meanwhile) and feed its
        end to the signals (the breaker's feed and the metrics subscribe); returns how it ended."""
        proxy, conn = self.proxy, answer.connection
        assert conn is not None
        proxy.live.add(unit.id, relay)
        try:
            kind = End.CLIENT_GONE
            if not first or await relay.start(answer):
                itl = proxy.signals.token_gaps(unit.id)
                kind = await relay.pump(answer, itl, resumed=not first)
        except asyncio.CancelledError:
            proxy.signals.cancelled(unit.id)
            raise
        finally:
            proxy.live.discard(unit.id, relay)
            proxy.upstream.finish(answer)  # closes the connection unless the answer ended cleanly
        self._outcome(unit, kind, relay.gap)
        return kind

    def _outcome(self, unit: UnitState, kind: End, gap: float | None) -> None:
        proxy = self.proxy
        if self.tracker is not None and self.tracker.capable is not None:
            unit.token_ids = self.tracker.capable
        proxy.signals.answer_ended(unit, kind, gap, self.start)

    async def _resume(
        self, relay: StreamRelay, broken: UnitState, kind: End
    ) -> tuple[UnitState, Answer] | None:
        """Continue the stream on another unit, or end it; None once it is ended."""
        proxy, tracker, call = self.proxy, self.tracker, self.call
        assert call.lease.unit is broken
        call.lease.drop()
        if tracker is None or kind is End.TOTAL_TIMEOUT:
            await relay.fail(kind)
            return None
        if tracker.finish_reason is not None:  # only the usage chunk and [DONE] were missing
            await self._close(relay, tracker.closing())
            return None
        refusal = self._refusal(tracker, broken)
        if refusal is not None:
            await relay.fail(kind, refusal)
            return None
        chat = tracker.chat
        total = max_new_tokens(self.data, chat)
        remaining = None if total is None else total - tracker.committed
        if remaining is not None and remaining <= 0:  # every token was relayed but the finish
            await self._close(relay, tracker.closing("length"))
            return None
        prompt = tracker.resume_point()
        assert prompt is not None  # capable units gave their prompt ids
        body = continuation(self.data, call.info.model, prompt, remaining, tracker.committed)
        resume = Call(
            COMPLETIONS_PATH,
            body,
            call.info,
            call.key,
            call.rid,
            call.deadline,
            call.lease,
            call.span,
        )
        resume.tried = [*call.tried, broken]
        try:
            cause = None if kind is End.UNIT_EJECTED else (broken.id, kind.value)
            unit, answer = await proxy.dispatcher.resume(resume, cause)
        except GatewayError as exc:
            self._resumed(broken, "gave_up", f"{kind}: no continuation ({exc.message})")
            await relay.fail(kind, exc.message)
            return None
        call.tried = resume.tried
        if not answer.streaming or answer.status != 200:  # refused: a 4xx, or not a stream
            call.lease.drop()
            detail = f"unit {unit.id} answered HTTP {answer.status}: {_excerpt(answer.first)}"
            self._resumed(broken, "gave_up", f"{kind}: {detail}")
            await relay.fail(kind, detail)
            return None
        proxy.live.began(unit.id, asyncio.get_running_loop().time())
        tracker.begin_continuation()
        detail = f"{kind}: continued on {unit.id} after {tracker.committed} tokens"
        self._resumed(broken, "ok", detail)
        return unit, answer

    def _refusal(self, tracker: StreamTracker, broken: UnitState) -> str | None:
        if not tracker.capable:
            self._resumed(broken, "unsupported", "the unit returned no token ids")
            return f"unit {broken.id} returns no token ids"
        limit = self.proxy.config.resume.max_resumes
        if tracker.resumes >= limit:
            self._resumed(broken, "gave_up", f"resume limit ({limit}) reached")
            return f"the stream was already resumed {tracker.resumes} time(s)"
        return None

    def _resumed(self, broken: UnitState, outcome: str, detail: str) -> None:
        proxy, call = self.proxy, self.call
        proxy.signals.resumed(broken, outcome, call.rid, detail)
        if call.span is not None:
            call.span.add_event("resume", {"unitgate.unit": broken.id, "outcome": outcome})

    @staticmethod
    async def _close(relay: StreamRelay, tail: bytes) -> None:
        if await relay.write(tail):
            await relay.finish()


def _excerpt(body: bytes) -> str:
    return body[:200].decode("utf-8", "replace")
