"""Admission over priority classes: who gets a slot, who waits, who is shed, who is preempted.

Pure and synchronous: the caller passes the clock (`now`, `Entry.since`) and the slots in use
by class (`Slots`); it owns the requests, the units and the timers. The rules:

1. Reservation (reserve.py): a class takes a slot only if the free slots left after it cover
   the unused reservations of the classes ranked above it.
2. Order: a freed slot goes to the most important class with a waiter it fits; within a class
   to the least-served tenant's oldest waiter (fairshare.py). A class that does not fit stops
   the search, since no less important class fits either.
3. No overtaking: an arrival is admitted at once only if no class at or above its own has a
   waiter; otherwise it waits behind them. Less important waiters never hold it up.
4. Bounded wait: a waiter is due out at `since + queue_timeout` of its class (`expired`);
   `next` never admits one past that. A class with queue_size or queue_timeout 0 never waits.
5. Shedding (429): an arrival that cannot wait because its class's queue is full displaces the
   newest waiter of the tenant with the most waiters in its class, if that tenant has at
   least two more waiting than the arrival's own; else the arrival is shed. When the total
   queue (`queue_limit`) is full, it first displaces from the least important class with a
   waiter ranked below its own (that class's heaviest tenant's newest waiter). So at
   saturation the lowest class goes first, and within a class a flood sheds its own.
6. Preemption (503, only with `preempt`): while more waiters of the most important class wait
   than slots are already on their way to them (`releasing`), the newest request of the least
   important class that has not yet sent its first byte may be cancelled for them. The freed
   slot reaches them by rule 2 (the most important class fits whenever anyone does).
7. Headroom between tenants: in a class that more than one tenant used in the last
   `ACTIVE_WINDOW` seconds, a tenant that already holds slots, its fair share of the class's
   or more (the slots not held back for more important classes, divided by the active
   tenants), takes another only if that leaves free, for each other active tenant, as many
   slots as it holds, at least one (at most `HEADROOM_SHARE` of the capacity in all). So a
   flooding tenant leaves room for a steady one to double its requests in flight at once:
   they start without waiting for a slot to end. Alone, a tenant uses every slot. The cost:
   while others are active, up to that many slots may stand idle. (The headroom is kept from
   the class's own tenants only: a less important class may take it.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Generic, TypeVar

from gateway.config.priority import PriorityClass, PriorityConfig
from gateway.routing.fairshare import FairLine
from gateway.routing.reserve import fits, held_back

H = TypeVar("H")
R = TypeVar("R")

_size = attrgetter("size")  # a line's waiters, read in C (no generator frame per admission)
ACTIVE_WINDOW = 10.0  # seconds: a tenant seen this recently in a class counts for rule 7
HEADROOM_SHARE = 0.25  # rule 7 keeps free at most this share of the slots


@dataclass(frozen=True, slots=True, eq=False)
class Entry(Generic[H]):
    """A request asking for a slot; equal only to itself."""

    handle: H  # the caller's request
    klass: str
    tenant: str
    tokens: int  # estimated: prompt plus max_tokens
    since: float  # when it arrived (the caller's clock)


@dataclass(frozen=True, slots=True)
class Running(Generic[R]):
    """A request holding a slot, as preemption sees it."""

    handle: R
    klass: str
    started: bool  # its first byte reached the client: no longer preemptible
    since: float  # when it was admitted


@dataclass(frozen=True, slots=True)
class Slots:
    capacity: int  # slots in all (the gateway's limit, or the routable units' caps)
    used: Mapping[str, int] = field(default_factory=dict)  # in flight, by class
    # In flight by (class, tenant), for rule 7; empty: rule 7 is off.
    tenants: Mapping[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Admit:
    pass


@dataclass(frozen=True, slots=True)
class Queue(Generic[H]):
    displaced: Entry[H] | None = None  # a waiter shed to make room: answer it 429


@dataclass(frozen=True, slots=True)
class Shed:
    reason: str  # for the 429's message


ADMIT = Admit()


class ClassQueues(Generic[H]):
    def __init__(self, config: PriorityConfig, queue_limit: int) -> None:
        """`queue_limit`: waiters over all classes at once ([admission].queue_size)."""
        self.config = config
        self.queue_limit = queue_limit
        self.ranked = config.ranked
        self._class = {c.name: c for c in self.ranked}
        self._lines: dict[str, FairLine[Entry[H]]] = {c.name: FairLine() for c in self.ranked}
        # Per class, its line and those of the more important classes (rule 3 reads them on
        # every admission).
        self._above = {
            c.name: tuple(self._lines[o.name] for o in self.ranked if o.rank <= c.rank)
            for c in self.ranked
        }
        # Rule 7: per class, when each tenant last arrived; pruned once a second.
        self._seen: dict[str, dict[str, float]] = {c.name: {} for c in self.ranked}
        self._pruned = 0.0

    def __len__(self) -> int:
        return sum(map(_size, self._lines.values()))

    def __bool__(self) -> bool:
        return any(map(_size, self._lines.values()))

    def __iter__(self) -> Iterator[Entry[H]]:
        for c in self.ranked:
            yield from self._lines[c.name]

    def waiting(self, klass: str) -> int:
        return len(self._lines[klass])

    def deadline(self, entry: Entry[H]) -> float:
        return entry.since + self._class[entry.klass].queue_timeout

    def offer(
        self, entry: Entry[H], slots: Slots, eligible: Callable[[Entry[H]], bool] | None = None
    ) -> Admit | Queue[H] | Shed:
        """Admit `entry` now, queue it (maybe displacing a waiter), or shed it (rules 3-5).

        `eligible`: whether a slot fitting the class could also take this request (e.g. some
        unit serving its model has room); None = always."""
        klass = self._class[entry.klass]
        line = self._lines[entry.klass]
        self._seen[klass.name][entry.tenant] = entry.since
        if (
            not self._waiting_at_or_above(klass)
            and fits(self.ranked, klass.name, slots.capacity, slots.used)
            and self._tenant_fits(klass.name, entry.tenant, entry.since, slots)
            and (eligible is None or eligible(entry))
        ):
            line.serve(entry.tenant, entry.tokens)
            return ADMIT
        if klass.queue_size == 0 or klass.queue_timeout == 0:
            return Shed(f"no slot is free and the {klass.name} class does not wait")
        displaced = None
        if self._full(klass):
            displaced = self.shed_victim(entry)
            if displaced is None:
                return Shed(self._why_full(klass))
            self.remove(displaced)
        line.push(entry)
        return Queue(displaced)

    def next(
        self, now: float, slots: Slots, eligible: Callable[[Entry[H]], bool] | None = None
    ) -> Entry[H] | None:
        """The waiter that takes a free slot (rule 2), removed from the queue; None if none
        may. Waiters past their deadline are left for `expired`."""
        for klass in self.ranked:
            line = self._lines[klass.name]
            if not line:
                continue
            if not fits(self.ranked, klass.name, slots.capacity, slots.used):
                return None
            due = klass.queue_timeout

            def ok(e: Entry[H], due: float = due) -> bool:
                return now < e.since + due and (eligible is None or eligible(e))

            def tenant_ok(tenant: str, name: str = klass.name) -> bool:
                return self._tenant_fits(name, tenant, now, slots)

            entry = line.pop(ok, tenant_ok if slots.tenants else None)
            if entry is not None:
                return entry
        return None

    def expired(self, now: float) -> list[Entry[H]]:
        """Waiters past their deadline, removed (rule 4): answer them 429."""
        out: list[Entry[H]] = []
        for klass in self.ranked:
            due = klass.queue_timeout

            def dead(e: Entry[H], due: float = due) -> bool:
                return now >= e.since + due

            out += self._lines[klass.name].remove_if(dead)
        return out

    def remove(self, entry: Entry[H]) -> bool:
        """Take a waiter out (its client left, or its own timer fired); False if not queued."""
        return self._lines[entry.klass].remove(entry)

    def charge(self, klass: str, tenant: str, tokens: float) -> None:
        """Correct a tenant's served tokens once the real count is known (minus the estimate)."""
        self._lines[klass].charge(tenant, tokens)

    def shed_victim(self, entry: Entry[H]) -> Entry[H] | None:
        """The waiter `entry` displaces when its queue is full (rule 5), or None: shed `entry`
        itself (also None while there is room)."""
        klass = self._class[entry.klass]
        if len(self._lines[klass.name]) < klass.queue_size and len(self) >= self.queue_limit:
            for lower in reversed(self.ranked):
                if lower.rank <= klass.rank:
                    break
                victim = self._heaviest_newest(lower.name)
                if victim is not None:
                    return victim
        if not self._full(klass):
            return None
        line = self._lines[klass.name]
        heavy = line.heaviest()
        if heavy is None or heavy == entry.tenant:
            return None
        if line.waiting(heavy) < line.waiting(entry.tenant) + 2:
            return None
        return line.newest(heavy)

    def preempt_candidate(
        self, now: float, running: Iterable[Running[R]], releasing: int = 0
    ) -> Running[R] | None:
        """A request to cancel (503) so a top-class waiter gets its slot (rule 6), or None.

        `running`: requests holding slots; `releasing`: slots of requests already preempted
        and not yet given back."""
        if not self.config.preempt or len(self.ranked) < 2:
            return None
        top = self.ranked[0]
        due = top.queue_timeout
        waiting = sum(1 for e in self._lines[top.name] if now < e.since + due)
        if waiting <= releasing:
            return None
        bottom = self.ranked[-1].name
        victims = (r for r in running if r.klass == bottom and not r.started)
        return max(victims, key=lambda r: r.since, default=None)

    def active(self, klass: str, now: float) -> int:
        """Tenants that asked for a slot in `klass` in the last ACTIVE_WINDOW seconds."""
        if now - self._pruned >= 1.0:
            self._pruned = now
            for seen in self._seen.values():
                for tenant in [t for t, at in seen.items() if now - at > ACTIVE_WINDOW]:
                    del seen[tenant]
        return len(self._seen[klass])

    def _tenant_fits(self, klass: str, tenant: str, now: float, slots: Slots) -> bool:
        """Rule 7: whether `tenant` may take one more of the slots `klass` may take."""
        if not slots.tenants:
            return True
        active = self.active(klass, now)
        if active <= 1:
            return True
        held = slots.tenants.get((klass, tenant), 0)
        back = held_back(self.ranked, klass, slots.capacity, slots.used)
        room = slots.capacity - back  # the slots this class may use at all
        if held == 0 or (held + 1) * active <= room:  # none yet, or within its fair share
            return True
        free_after = slots.capacity - sum(slots.used.values()) - 1 - back
        return free_after >= self._headroom(klass, tenant, slots)

    def _headroom(self, klass: str, tenant: str, slots: Slots) -> int:
        """Rule 7's free slots: for each other active tenant as many as it holds, at least one
        (so a steady tenant's in-flight count may double at once), HEADROOM_SHARE at most."""
        most = max(1, int(HEADROOM_SHARE * slots.capacity))
        need = 0
        for other in self._seen[klass]:
            if other != tenant:
                need += max(1, slots.tenants.get((klass, other), 0))
                if need >= most:
                    return most
        return need

    def _waiting_at_or_above(self, klass: PriorityClass) -> bool:
        return any(map(_size, self._above[klass.name]))

    def _full(self, klass: PriorityClass) -> bool:
        return len(self._lines[klass.name]) >= klass.queue_size or len(self) >= self.queue_limit

    def _why_full(self, klass: PriorityClass) -> str:
        if len(self._lines[klass.name]) >= klass.queue_size:
            return f"every slot is taken and the {klass.name} queue is full"
        return "every slot is taken and the wait queue is full"

    def _heaviest_newest(self, klass: str) -> Entry[H] | None:
        line = self._lines[klass]
        heavy = line.heaviest()
        return line.newest(heavy) if heavy is not None else None
