"""Admission control: per-unit in-flight caps, and wait queues per priority class.

A request that finds every candidate unit full waits instead of being refused at once, because
LLM requests finish every few seconds and a short wait beats a client retry storm. Who waits,
who goes first, who is shed and who is preempted is decided by the class queues
(routing/classes.py, pure); this module owns the waiting requests, the slots and the clock.

- A request asks in a class, as a tenant, for an estimated number of tokens (`Ask`).
- Without `[priority]` there is one class, `standard`, sized by `[admission]`: one line, fair
  between tenants (one tenant, "anonymous", without keys: first come, first served).
- A freed slot, or a change in which units are routable, "pumps" the queues: waiters are
  placed while some unit takes them, the most important class first.
- Every queue is bounded in size and in time; past either bound the answer is 429 with
  Retry-After.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from gateway.base.loop import KeepsLoop
from gateway.config.priority import PriorityClass, PriorityConfig
from gateway.errors import GatewayError, Overloaded
from gateway.routing.classes import Admit, ClassQueues, Entry, Queue, Running, Slots
from gateway.routing.reserve import fits

STANDARD = "standard"
ANONYMOUS = "anonymous"


class Slot(Protocol):
    inflight: int


class Holder(Protocol):
    """Who holds a slot, as preemption sees it ([priority].preempt): whether its answer has
    begun reaching its client (no longer preemptible), and how to cancel it (a 503)."""

    @property
    def started(self) -> bool: ...

    def preempt(self) -> None: ...


S = TypeVar("S", bound=Slot)


@dataclass(frozen=True, slots=True)
class Ask:
    """What a request asks admission for: a slot in `klass`, as `tenant`, for about `tokens`."""

    klass: str = STANDARD
    tenant: str = ANONYMOUS
    tokens: int = 1


DEFAULT_ASK = Ask()


def one_class(queue_size: int, queue_timeout: float) -> PriorityConfig:
    """A gateway without `[priority]`: one class, `standard`, as `[admission]` sizes it."""
    only = PriorityClass(STANDARD, 0, 0.0, queue_size=queue_size, queue_timeout=queue_timeout)
    return PriorityConfig(classes=(only,), default=STANDARD)


class _Waiter(Generic[S]):
    """A queued request: the unit picker it brings, and the future its placement resolves."""

    __slots__ = ("future", "holder", "pick")

    def __init__(
        self, pick: Callable[[], S | None], future: asyncio.Future[S], holder: Holder | None
    ) -> None:
        self.pick = pick
        self.future = future
        self.holder = holder


class Admission(KeepsLoop):
    def __init__(
        self,
        queue_size: int,
        queue_timeout: float,
        retry_after: int,
        limit: int | None = None,
        classes: PriorityConfig | None = None,
        capacity: Callable[[], int] | None = None,
    ) -> None:
        """`limit`: slots over all units at once (the gateway's own capacity, e.g. what its
        open-files limit allows); past it requests queue as if every unit were full.
        `classes`: the priority classes (None: `standard` alone, with `queue_size` and
        `queue_timeout`); `queue_size` then bounds the waiters of all classes together.
        `capacity`: the slots the routable units offer, the base of the classes' reserved
        shares (None: `limit`); read again whenever routability changes (`wake_all`)."""
        self.queue_size = queue_size
        self.queue_timeout = queue_timeout
        self.retry_after = retry_after
        self.limit = limit
        self.classes = classes or one_class(queue_size, queue_timeout)
        self.queues: ClassQueues[_Waiter[Slot]] = ClassQueues(self.classes, queue_size)
        self.inflight = 0
        self.used: dict[str, int] = {c.name: 0 for c in self.classes.classes}
        self.tenants: dict[tuple[str, str], int] = {}  # in flight by (class, tenant)
        self._capacity_of = capacity
        self._capacity = self._measure()
        # Preemption: the least important class's requests holding slots (when they got them),
        # and those already told to give theirs back.
        ranked = self.classes.ranked
        self._bottom = ranked[-1].name if self.classes.preempt and len(ranked) > 1 else None
        self._top = ranked[0].name
        self._preemptible: dict[Holder, float] = {}
        self._preempted: set[Holder] = set()
        self._loop = None

    @property
    def queued(self) -> int:
        return len(self.queues)

    def waiting(self, klass: str) -> int:
        return self.queues.waiting(klass)

    def by_class(self) -> dict[str, tuple[int, int]]:
        """(waiting, in flight) per class, most important first."""
        ranked = self.queues.ranked
        return {c.name: (self.queues.waiting(c.name), self.used[c.name]) for c in ranked}

    def slots(self) -> Slots:
        return Slots(self._capacity, self.used, self.tenants)

    async def acquire(
        self, pick: Callable[[], S | None], ask: Ask = DEFAULT_ASK, holder: Holder | None = None
    ) -> S:
        """Take a slot on the unit `pick` returns; `pick` raises Overloaded(503) if none can ever.

        New arrivals do not overtake queued requests of their class or a more important one.
        `holder`: the request, which preemption may cancel (release must name it too)."""
        loop = self._loop or self._bind_loop()
        waiter: _Waiter[S] = _Waiter(pick, loop.create_future(), holder)
        entry = Entry(waiter, ask.klass, ask.tenant, ask.tokens, loop.time())
        verdict = self.queues.offer(entry, self.slots(), self._placed)  # type: ignore[arg-type]
        if isinstance(verdict, Admit):
            return waiter.future.result()  # placed, or pick's error raised
        if not isinstance(verdict, Queue):
            raise self.saturated(verdict.reason)
        if verdict.displaced is not None:
            self._refuse(verdict.displaced)
        self.pump()  # a unit of its model may have room though those ahead wait for theirs
        if self._bottom is not None and ask.klass == self._top:
            self._preempt(loop.time())
        return await self._wait(entry, waiter)

    def try_acquire(self, pick: Callable[[], S | None], ask: Ask = DEFAULT_ASK) -> S | None:
        """A slot at once on the unit `pick` returns, or None: nothing queues. For a hedge's
        second copy, which is better not sent than made to wait, and not sent at all while
        any request waits for a slot. It is never preempted (it holds no place in a queue)."""
        if self.queues or (self.limit is not None and self.inflight >= self.limit):
            return None
        if not fits(self.classes.ranked, ask.klass, self._capacity, self.used):
            return None
        try:
            unit = pick()
        except GatewayError:
            return None
        if unit is not None:
            self._take(unit, ask.klass, ask.tenant)
        return unit

    def _take(self, unit: Slot, klass: str, tenant: str) -> None:
        unit.inflight += 1
        self.inflight += 1
        self.used[klass] += 1
        key = (klass, tenant)
        self.tenants[key] = self.tenants.get(key, 0) + 1

    def release(
        self,
        unit: Slot,
        klass: str = STANDARD,
        holder: Holder | None = None,
        tenant: str = ANONYMOUS,
    ) -> None:
        unit.inflight -= 1
        self.inflight -= 1
        self.used[klass] -= 1
        key = (klass, tenant)
        if (left := self.tenants[key] - 1) > 0:
            self.tenants[key] = left
        else:
            del self.tenants[key]
        if holder is not None and self._bottom is not None:
            self._preemptible.pop(holder, None)
            self._preempted.discard(holder)
        self.pump()

    def _preempt(self, now: float) -> None:
        """Cancel the request classes.py picks for a top-class waiter (rule 6), if any."""
        bottom = self._bottom
        assert bottom is not None
        # Newest first, so that of two placed at the same instant the later one goes.
        placed = reversed(self._preemptible.items())
        running = (Running(h, bottom, h.started, since) for h, since in placed)
        victim = self.queues.preempt_candidate(now, running, len(self._preempted))
        if victim is not None:
            del self._preemptible[victim.handle]
            self._preempted.add(victim.handle)
            victim.handle.preempt()  # its slot comes back through `release`

    def charge(self, ask: Ask, tokens: int) -> None:
        """The request's real token count, once known: its tenant's share is corrected."""
        self.queues.charge(ask.klass, ask.tenant, tokens - ask.tokens)

    def wake_all(self) -> None:
        """Routability changed: the capacity is measured again, every waiter looks again."""
        self._capacity = self._measure()
        self.pump()

    def pump(self) -> None:
        """Place waiters while some unit takes one (the classes' order: queues.next)."""
        if not self.queues:
            return
        now = asyncio.get_running_loop().time()
        while self.queues.next(now, self.slots(), self._placed) is not None:
            pass

    def _placed(self, entry: Entry[_Waiter[Slot]]) -> bool:
        """Whether `entry` takes a slot now; if so it has it (or its pick's error), resolved
        in its future. A waiter whose future is done (it timed out, it left) takes nothing."""
        waiter = entry.handle
        if waiter.future.done() or (self.limit is not None and self.inflight >= self.limit):
            return False
        try:
            unit = waiter.pick()
        except GatewayError as exc:  # no unit can ever serve it: told at once
            waiter.future.set_exception(exc)
            return True
        if unit is None:
            return False
        self._take(unit, entry.klass, entry.tenant)
        if entry.klass == self._bottom and waiter.holder is not None:
            self._preemptible[waiter.holder] = asyncio.get_running_loop().time()
        waiter.future.set_result(unit)
        return True

    async def _wait(self, entry: Entry[_Waiter[S]], waiter: _Waiter[S]) -> S:
        klass = self.classes.get(entry.klass)
        try:
            async with asyncio.timeout_at(self.queues.deadline(entry)):  # type: ignore[arg-type]
                return await asyncio.shield(waiter.future)
        except TimeoutError:
            if waiter.future.done():  # placed as the deadline struck: take it
                return waiter.future.result()
            self.queues.remove(entry)  # type: ignore[arg-type]
            raise self.saturated(
                f"all units stayed at capacity for {klass.queue_timeout:g} s"
                + ("" if len(self.classes.classes) == 1 else f" ({klass.name} class)")
            ) from None
        except asyncio.CancelledError:  # the client left
            if not self.queues.remove(entry):  # type: ignore[arg-type]
                if waiter.future.done() and waiter.future.exception() is None:
                    unit = waiter.future.result()
                    self.release(unit, entry.klass, waiter.holder, entry.tenant)
            else:
                waiter.future.cancel()
            raise

    def _refuse(self, entry: Entry[_Waiter[Slot]]) -> None:
        """A waiter displaced from a full queue by a newcomer (classes.py, rule 5)."""
        if not entry.handle.future.done():
            why = f"the queue is full and this {entry.klass} request was shed to make room"
            entry.handle.future.set_exception(self.saturated(why))

    def _measure(self) -> int:
        measured = self._capacity_of() if self._capacity_of is not None else self.limit
        if measured is None:
            return 1 << 30  # no bound known: reservations hold nothing back
        return min(measured, self.limit) if self.limit is not None else measured

    def saturated(self, message: str) -> Overloaded:
        return Overloaded(message, status=429, code="saturated", retry_after=self.retry_after)
