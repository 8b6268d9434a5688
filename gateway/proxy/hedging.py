"""Hedged requests, on the request path: who may be hedged, and the race of two copies.

A hedge-eligible request's first copy is sent as any other; if its first bytes have not come
after the delay (gateway/routing/hedge.py), a second copy goes to another unit, and the first
of the two whose answer begins wins. Both copies wait in `UpstreamClient.open`, which returns
only once an answer's first body bytes are in, and nothing reaches the client before that
return: the loser is cancelled before it could send the client a byte, and its connection is
closed, which is how vLLM and the builtin engine hear that a request was aborted.

Tied requests ("The Tail at Scale"): a builtin engine's leader says in its health that it
answers a request marked `x-unitgate-tied: 1` with its head as soon as its engine starts it
(leaves the queue, its prompt fed), before its first token. Where the first unit and another
both do, both copies are marked; unless the first starts within `tie_delay` (an idle unit
does, and a twin would then start too and waste its prefill), the twin goes at once and the
first head (a 200) wins: the other copy is closed then, most often while it still waits in its
unit's queue, so it costs no prefill. Only a twin that had started too counts against the
budget (as wasted).

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
TIED = "tied"  # call.hedge while a tied pair races; then "tied first" or "tied second"
TIED_LINE = b"x-unitgate-tied: 1\r\n"  # a tied copy's header: its head comes at its start

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


class Starts:
    """The order in which a tied pair's copies started: their units sent a 200 head."""

    def __init__(self) -> None:
        self.order: list[int] = []  # 0: the first copy, 1: the twin
        self._woke = asyncio.Event()

    def hook(self, copy: int) -> Callable[[int], None]:
        """What copy `copy`'s upstream calls with its answer's status when its head came."""

        def on_head(status: int) -> None:
            if status == 200:
                self.order.append(copy)
                self._woke.set()

        return on_head

    async def first(
        self, copies: tuple[asyncio.Task[T], ...], within: float | None = None
    ) -> int | None:
        """Until a copy started (returns which), one ended without starting (None: it
        failed, or answered with another status; any other runs on alone), or `within`
        seconds passed (None)."""
        waiter = asyncio.ensure_future(self._woke.wait())
        try:
            await asyncio.wait(
                {*copies, waiter}, timeout=within, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiter.cancel()
        return self.order[0] if self.order else None


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
