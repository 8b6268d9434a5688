"""One class's wait line, fair between tenants by a virtual token counter (VTC).

After Sheng et al., "Fairness in Serving Large Language Models" (OSDI 2024). Each tenant has a
counter of the tokens it was served. The waiter that goes next is the oldest one of the tenant
whose counter is smallest: a tenant flooding the line is served as often as one that sends a
request now and then, not more often. Ties go to the tenant whose oldest waiter is older;
within a tenant the line is FIFO.

A tenant's counter grows by a request's estimated tokens when it is admitted, queued or not
(`charge` corrects the estimate once the real count is known). A tenant joining the line (it
had nobody waiting) is lifted to the smallest counter among the tenants waiting, or, on an
empty line, to the counter of the last tenant to leave it: being idle banks no credit, so a
tenant back after a quiet hour cannot then hold the line. Counters of tenants with nobody
waiting are forgotten beyond `remembered`, the least served first (a forgotten tenant comes
back at the lift, which is about where a small counter would be lifted to anyway).

Picking is a scan over the waiting tenants (at most the class's queue size), not a heap: the
counters move on every admission and the scan is simpler to get right.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar


class Waiter(Protocol):
    @property
    def tenant(self) -> str: ...
    @property
    def tokens(self) -> int: ...
    @property
    def since(self) -> float: ...


W = TypeVar("W", bound=Waiter)


class FairLine(Generic[W]):
    def __init__(self, remembered: int = 1024) -> None:
        self.remembered = remembered
        self._lines: dict[str, deque[W]] = {}  # waiting tenants only, each FIFO
        self._counters: dict[str, float] = {}
        self._floor = 0.0  # the last leaver's counter: the lift on an empty line
        self.size = 0  # waiters (read it, never set it: what len() gives, without a call)

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[W]:
        for line in self._lines.values():
            yield from line

    def waiting(self, tenant: str) -> int:
        line = self._lines.get(tenant)
        return len(line) if line is not None else 0

    def counter(self, tenant: str) -> float:
        """The tenant's counter as picking sees it (a tenant not waiting: as it would join)."""
        known = self._counters.get(tenant, 0.0)
        return known if tenant in self._lines else max(known, self._lift())

    def push(self, waiter: W) -> None:
        line = self._lines.get(waiter.tenant)
        if line is None:
            self._counters[waiter.tenant] = self.counter(waiter.tenant)
            line = self._lines[waiter.tenant] = deque()
        line.append(waiter)
        self.size += 1

    def pop(
        self, ok: Callable[[W], bool], tenant_ok: Callable[[str], bool] | None = None
    ) -> W | None:
        """The next waiter `ok` accepts (least-served tenant first), removed and charged;
        `tenant_ok` skips a tenant's waiters all at once (a tenant at its share of slots)."""
        if not self._lines:
            return None
        first = min(self._lines, key=self._order)
        waiter = _first(self._lines[first], ok) if tenant_ok is None or tenant_ok(first) else None
        if waiter is None:  # the caller skips waiters it cannot place (overdue, unroutable)
            for tenant in sorted(self._lines, key=self._order):
                if tenant == first or (tenant_ok is not None and not tenant_ok(tenant)):
                    continue
                waiter = _first(self._lines[tenant], ok)
                if waiter is not None:
                    break
        if waiter is not None:
            self._counters[waiter.tenant] += waiter.tokens
            self.remove(waiter)
        return waiter

    def serve(self, tenant: str, tokens: int) -> None:
        """Charge an admission that did not wait (a tenant not waiting joins at the lift)."""
        # `counter`, written out for the common case (nobody waits: the lift is the floor).
        known = self._counters.get(tenant, 0.0)
        if tenant not in self._lines:
            lift = self._lift() if self._lines else self._floor
            known = known if known >= lift else lift
        self._counters[tenant] = known + tokens
        if len(self._counters) > 2 * self.remembered + len(self._lines):
            self._forget()

    def charge(self, tenant: str, tokens: float) -> None:
        """Correct a counter by `tokens` (real count minus estimate; either sign)."""
        if tenant in self._counters:
            self._counters[tenant] += tokens

    def remove(self, waiter: W) -> bool:
        line = self._lines.get(waiter.tenant)
        if line is None or waiter not in line:
            return False
        line.remove(waiter)
        self.size -= 1
        if not line:
            del self._lines[waiter.tenant]
            if not self._lines:
                self._floor = max(self._floor, self._counters[waiter.tenant])
            self._forget()
        return True

    def remove_if(self, dead: Callable[[W], bool]) -> list[W]:
        """Every waiter `dead` holds true of, removed, oldest first."""
        gone = sorted((w for w in self if dead(w)), key=lambda w: w.since)
        for waiter in gone:
            self.remove(waiter)
        return gone

    def heaviest(self) -> str | None:
        """The tenant with the most waiters (then the most served): the first to lose one."""
        if not self._lines:
            return None
        return max(self._lines, key=lambda t: (len(self._lines[t]), self._counters[t]))

    def newest(self, tenant: str) -> W:
        return self._lines[tenant][-1]

    def _order(self, tenant: str) -> tuple[float, float]:
        return self._counters[tenant], self._lines[tenant][0].since

    def _lift(self) -> float:
        return min((self._counters[t] for t in self._lines), default=self._floor)

    def _forget(self) -> None:
        if len(self._counters) <= 2 * self.remembered + len(self._lines):
            return
        idle = [t for t in self._counters if t not in self._lines]
        idle.sort(key=self._counters.__getitem__, reverse=True)
        for tenant in idle[self.remembered :]:
            del self._counters[tenant]


def _first(line: deque[W], ok: Callable[[W], bool]) -> W | None:
    return next((w for w in line if ok(w)), None)
