"""Hedged requests' races, on the request path: a second copy after the delay, or a tied pair
sent at once, and the answer that begins (or starts) first (hedging.py says the rules; this
module runs them). The dispatcher hands a hedge-eligible call's first attempt here, and lends
what a race needs of it through `Attempts`: a unit admitted for the first copy, an attempt
sent on a slot, the routable units, a prompt's size and the units' cached prefixes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from gateway.config import Config
from gateway.proxy.call import Call
from gateway.proxy.hedging import (
    FIRST,
    SECOND,
    TIED,
    Hedger,
    Starts,
    cancelled,
    first_of,
    unused,
)
from gateway.proxy.lease import Lease
from gateway.proxy.upstream import Answer
from gateway.routing.admission import Admission
from gateway.routing.forecast import Placed
from gateway.signals import Signals
from gateway.units import UnitState

Opened = tuple[UnitState, Answer]
RECHECK = 0.1  # seconds between asks for a delay while none is known (Races._wait)


class Attempts(Protocol):
    """What a race needs of the dispatcher (dispatch.py)."""

    async def admit(self, call: Call) -> UnitState:
        """A unit for the call's first copy, its slot held in `call.lease`."""
        ...

    def send(
        self,
        call: Call,
        unit: UnitState,
        lease: Lease,
        placed: Placed | None,
        routed: str,
        on_head: Callable[[int], None] | None = None,
    ) -> Coroutine[Any, Any, Opened]:
        """One attempt on `unit`, whose slot `lease` holds."""
        ...

    def routable(self, call: Call) -> tuple[UnitState, ...]: ...

    def prompt_tokens(self, call: Call) -> int: ...

    def place(
        self,
        call: Call,
        routable: Sequence[UnitState],
        cached: Mapping[str, int] | None,
        prompt: int,
    ) -> tuple[UnitState | None, str]:
        """balance.place with the gateway's load bounds."""
        ...

    def cached(self, call: Call, units: Sequence[UnitState]) -> Mapping[str, int]:
        """How many of the call's prompt tokens each unit's cache holds, where known."""
        ...

    def soonest(self, call: Call, units: Sequence[UnitState]) -> float | None:
        """The least time to first token predicted for the call on any of `units` (None:
        none of them predicts one)."""
        ...


class Races:
    def __init__(
        self,
        config: Config,
        hedger: Hedger,
        attempts: Attempts,
        admission: Admission,
        signals: Signals[Call],
        finish: Callable[[Answer], None],
        forecasting: bool,
    ) -> None:
        """`finish` closes an answer that lost the race after it began; `forecasting`: a
        second copy gets a placement for the forecast's feed, as a first copy does."""
        self.config, self.hedger, self.attempts = config, hedger, attempts
        self.admission, self.signals, self.finish = admission, signals, finish
        self.forecasting = forecasting

    async def run(self, call: Call) -> Opened:
        """The first copy; if its answer has not begun after the delay, a second copy on
        another unit, and the answer that begins first (hedging.py). A unit that announces
        its starts gets a tied pair instead."""
        hedge = self.hedger.config.hedge
        unit = await self.attempts.admit(call)
        placed, routed = call.placed, call.routed
        mine = self._uncached(call)
        delay = self._delay(call, unit)
        if unit.tied and hedge.tie and self._tie_partner(call, unit):
            return await self._tied(call, unit, mine, hedge.max_delay if delay is None else delay)
        began = asyncio.get_running_loop().time()
        first = asyncio.ensure_future(self.attempts.send(call, unit, call.lease, placed, routed))
        return await self._after_delay(call, unit, first, mine, delay, began)

    def _delay(self, call: Call, unit: UnitState) -> float | None:
        """How long the first copy on `unit` has before a second goes (Hedging.delay): from
        the request's time to first token on its unit and on the best other; None while
        neither is known, predicted or observed."""
        placed = call.placed
        own = None if placed is None else placed.predicted
        if own is None:  # its unit's model not learned yet: what it was seen to take
            own = self.attempts.soonest(call, (unit,))
        others = [u for u in self.attempts.routable(call) if u is not unit and u not in call.tried]
        elsewhere = self.attempts.soonest(call, others)
        if own is None and elsewhere is None:
            return None
        return self.hedger.hedging.delay(own, elsewhere)

    async def _wait(
        self,
        call: Call,
        unit: UnitState,
        first: asyncio.Task[Opened],
        delay: float | None,
        began: float,
    ) -> None:
        """Until `first` is done or its delay has passed since `began` (loop time). None:
        nothing was known when it was sent (a gateway just started), so the delay is
        `max_delay`, asked again every RECHECK seconds while it waits: the fleet's first
        answers give one."""
        loop = asyncio.get_running_loop()
        limit = self.hedger.config.hedge.max_delay if delay is None else delay
        while not first.done():
            left = limit - (loop.time() - began)
            if left <= 0:
                return
            await asyncio.wait({first}, timeout=left if delay is not None else min(left, RECHECK))
            if delay is None and not first.done():
                delay = self._delay(call, unit)
                limit = limit if delay is None else delay

    async def _after_delay(
        self,
        call: Call,
        unit: UnitState,
        first: asyncio.Task[Opened],
        mine: int,
        delay: float | None,
        began: float,
    ) -> Opened:
        """`first`'s answer; if it has not begun `delay` seconds after `began` (None: see
        `_wait`), a second copy on another unit, and the answer that begins first."""
        try:
            await self._wait(call, unit, first, delay, began)
            if first.done():
                return first.result()
            twin = self._twin(call, unit)
            if twin is None:
                return await first
            other, task, lease, tokens = twin
            self.signals.hedged(call, unit, other, tokens)
            (_, answer), second = await first_of(first, task, _begun)
        finally:
            await cancelled(first)
        wasted = mine if second else tokens
        return self._settle(call, (first, task), (unit, other), lease, second, answer, wasted)

    async def _tied(self, call: Call, unit: UnitState, mine: int, delay: float) -> Opened:
        """Both copies marked tied, to units that announce their starts: unless the first
        starts within `tie_delay`, the twin goes and the first to start its copy wins; the
        other copy is closed, most often while it still waits in its unit's queue. Only a
        loser that had started too wasted its prefill (hedging.py). A first copy that started
        at once is hedged after the delay as any other: a stall after a start (a node
        lagging its gang) is not what a tie answers."""
        starts = Starts()
        placed, routed = call.placed, call.routed
        began = asyncio.get_running_loop().time()
        first = asyncio.ensure_future(
            self.attempts.send(call, unit, call.lease, placed, routed, starts.hook(0))
        )
        try:
            # The first copy's own chance to start: an idle unit starts it within a step, and
            # a twin sent meanwhile would start too and waste its prefill.
            tie_delay = self.hedger.config.hedge.tie_delay
            if await starts.first((first,), tie_delay) is not None or first.done():
                return await self._after_delay(call, unit, first, mine, delay, began)
            twin = self._twin(call, unit, starts.hook(1))
            if twin is None:
                return await first
            other, task, lease, tokens = twin
            call.hedge = TIED
            self.signals.hedged(call, unit, other, 0)
            try:
                copy = await starts.first((first, task))
                if copy is None:  # one ended unstarted: the other runs on, as in a hedge's race
                    (_, answer), second = await first_of(first, task, _begun)
                else:
                    second = copy == 1
                    await cancelled(first if second else task)
                    _, answer = await (task if second else first)
            finally:
                await cancelled(task)
        finally:
            await cancelled(first)
        wasted = 0
        if len(starts.order) > 1:  # the loser had started too: its prefill ran
            wasted = mine if second else tokens
            self.hedger.hedging.spend(wasted, asyncio.get_running_loop().time())
        return self._settle(call, (first, task), (unit, other), lease, second, answer, wasted)

    def _settle(
        self,
        call: Call,
        copies: tuple[asyncio.Task[Opened], ...],
        units: tuple[UnitState, UnitState],
        lease: Lease,
        second: bool,
        answer: Answer,
        wasted: int,
    ) -> Opened:
        """A hedged request's race is decided: the loser's answer, if it began too, closed;
        the winner's slot made the request's; the observers told."""
        first, twin = copies
        late = unused(first if second else twin)
        if late is not None:  # the loser's answer began too: closed, the unit stops it
            self.finish(late[1])
            (call.lease if second else lease).drop()
        which = SECOND if second else FIRST
        call.hedge = f"{TIED} {which}" if call.hedge == TIED else which
        if second:  # the second copy's slot is the request's now
            call.lease.drop()
            call.lease.unit, lease.unit = lease.unit, None
        call.placed, call.routed = answer.placed, answer.routed
        won, lost = units[::-1] if second else units
        self.signals.hedge_ended(call, won, lost, second, wasted)
        return won, answer

    def _tie_partner(self, call: Call, first: UnitState) -> bool:
        """Whether another routable unit announces its starts (else: the delayed hedge)."""
        return any(u.tied and u is not first for u in self.attempts.routable(call))

    def _uncached(self, call: Call) -> int:
        """The request's uncached prompt tokens where it is placed now (its first copy's:
        asked before a second copy is sent, which places the call anew)."""
        placed = call.placed
        held = 0 if placed is None else placed.cached
        return max(self.attempts.prompt_tokens(call) - held, 0)

    def _twin(
        self,
        call: Call,
        first: UnitState,
        on_head: Callable[[int], None] | None = None,
    ) -> tuple[UnitState, asyncio.Task[Opened], Lease, int] | None:
        """The second copy, sent now to the best unit but `first` (one in another cell if
        any: a cell's stragglers are correlated), on a slot free now; None if the budget, the
        overload rule or a full fleet says no (told to the observers). With `on_head`, a tied
        copy: only to a unit that announces its starts, and charged to the budget only if it
        starts too (by the caller)."""
        now = asyncio.get_running_loop().time()
        prompt = self.attempts.prompt_tokens(call)
        cached: Mapping[str, int] = {}
        tied = on_head is not None

        def pick() -> UnitState | None:
            nonlocal cached
            others = [
                u
                for u in self.attempts.routable(call)
                if u is not first and u not in call.tried and (u.tied or not tied)
            ]
            away = [u for u in others if u.cell != first.cell]
            pool = tuple(away or others)
            if not pool:
                return None
            cached = self.attempts.cached(call, pool)
            unit, _ = self.attempts.place(call, pool, cached or None, prompt)
            return unit

        lease = Lease(self.admission)
        lease.ask = call.lease.ask
        tokens = prompt  # the second copy's prefill, until its unit's cache is known
        why = self.hedger.refusal(call, 0 if tied else tokens, now)
        unit = None if why is not None else self.admission.try_acquire(pick, lease.ask)
        if unit is None:
            self.signals.hedge_refused(call, why or "no_unit: no other unit has a free slot")
            return None
        lease.unit = unit
        tokens = max(prompt - cached.get(unit.id, 0), 0)
        if not tied:
            self.hedger.hedging.spend(tokens, now)
        placed = Placed(unit.id, prompt, prompt - tokens, None) if self.forecasting else None
        task = asyncio.ensure_future(
            self.attempts.send(call, unit, lease, placed, "hedge", on_head)
        )
        return unit, task, lease, tokens


def _begun(opened: Opened) -> bool:
    """A hedge's copy whose answer may win the race: a stream that began. Another status (a
    unit's 429 or 4xx) wins only if the other copy fails too."""
    return opened[1].status == 200
