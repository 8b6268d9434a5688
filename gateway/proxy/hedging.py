"""Hedged requests, on the request path: who may be hedged, and the race of two copies.

A hedge-eligible request's first copy is sent as any other; if its first bytes have not come
after the delay (gateway/routing/hedge.py), a second copy goes to another unit, and the first
of the two whose answer begins wins. Both copies wait in `UpstreamClient.open`, which returns
only once an answer's first body bytes are in, and nothing reaches the client before that
return: the loser is cancelled before it could send the client a byte, and its connection is
closed, which is how vLLM and the builtin engine hear that a request was aborted.

Who may be hedged: a resumable stream (streamed chat or completions with n = 1: after its first
byte, a failure is resumed, never hedged), whose class hedges (`[[priority.classes]] hedge`,
or `[hedge].enabled` without `[priority]`), and whose client did not send
`x-unitgate-hedge: off`. A stored response's read (one unit holds it) is never hedged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from gateway.config import Config
from gateway.proxy.call import Call
from gateway.routing.admission import Admission
from gateway.routing.hedge import FleetNow, Hedging
from gateway.units import UnitRegistry

HEADER = "x-unitgate-hedge"  # "off": this request is not hedged
FIRST, SECOND = "first", "second"  # which copy's answer the client got (call.hedge)

T = TypeVar("T")


class Hedger:
    def __init__(self, config: Config, units: UnitRegistry, admission: Admission) -> None:
        self.config = config
        self.units = units
        self.admission = admission
        self.hedging = Hedging(config.hedge)
        priority = config.priority
        self._classes = None if priority is None else {c.name: c.hedge for c in priority.classes}

    def eligible(self, call: Call) -> bool:
        if call.tracker is None or call.home is not None:  # not a resumable stream
            return False
        if call.headers.get(HEADER, "").strip().lower() == "off":
            return False
        if self._classes is None:
            return self.config.hedge.enabled
        return self._classes.get(call.lease.ask.klass, False)

    def refusal(self, call: Call, tokens: int, now: float) -> str | None:
        """Why no second copy may go now (None: it may)."""
        model = call.info.model
        units = [u for u in self.units.units.values() if model in u.models]
        routable = len(self.units.snapshot.get(model, ()))
        fleet = FleetNow(self.admission.queued, len(units), len(units) - routable)
        return self.hedging.refusal(tokens, fleet, now)


async def first_of(
    first: asyncio.Task[T], second: asyncio.Task[T], good: Callable[[T], bool] = lambda _: True
) -> tuple[T, bool]:
    """The answer of whichever copy's begins first, and whether it is the second's. An answer
    that is not `good` (a unit's 429, say) wins only if the other copy fails too; a copy still
    running when the race is decided is cancelled and waited for (its slot and connection
    given back) before this returns; a copy that had also answered is the caller's to close.
    If both fail, the first copy's failure is raised."""
    pending: set[asyncio.Task[T]] = {first, second}
    fallback: asyncio.Task[T] | None = None
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in (first, second):
                if task in done and not task.cancelled() and task.exception() is None:
                    if good(task.result()):
                        return task.result(), task is second
                    fallback = fallback or task
        if fallback is not None:
            return fallback.result(), fallback is second
        return first.result(), False  # both failed: the first's error is raised here
    finally:
        await cancelled(first, second)


def unused(task: asyncio.Task[T]) -> T | None:
    """What a copy that lost the race answered anyway (None: it failed or was cancelled)."""
    if task.done() and not task.cancelled() and task.exception() is None:
        return task.result()
    return None


async def cancelled(*tasks: asyncio.Task[T]) -> None:
    """Cancel the tasks not yet done and wait for them to end (their failures are theirs: a
    cancellation of the caller itself still propagates)."""
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: a loser's failure is no news
