"""A fake gateway around ClassQueues: slots, running requests and every request's fate."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field

from gateway.config.priority import PriorityConfig
from gateway.routing.classes import ADMIT, ClassQueues, Entry, Queue, Slots
from gateway.routing.reserve import fits


@dataclass
class FakeGateway:
    """Drives the policy as the mechanism will: offer on arrival, then pump freed slots."""

    config: PriorityConfig
    capacity: int
    queue_limit: int
    headroom: bool = False  # report slots by tenant too: rule 7 (headroom) applies
    queues: ClassQueues[int] = field(init=False)
    running: dict[int, Entry[int]] = field(default_factory=dict)
    entries: dict[int, Entry[int]] = field(default_factory=dict)
    fate: dict[int, str] = field(default_factory=dict)  # admitted, shed, displaced, expired, left
    admitted: list[Entry[int]] = field(default_factory=list)  # in order
    admitted_at: dict[int, float] = field(default_factory=dict)
    admitted_before: dict[int, int] = field(default_factory=dict)  # admissions ahead of arrival
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.queues = ClassQueues(self.config, self.queue_limit)

    def slots(self) -> Slots:
        used = Counter(e.klass for e in self.running.values())
        if not self.headroom:
            return Slots(self.capacity, used)
        return Slots(
            self.capacity, used, Counter((e.klass, e.tenant) for e in self.running.values())
        )

    def arrive(self, now: float, klass: str, tenant: str, tokens: int = 100) -> Entry[int]:
        entry = Entry(next(self._ids), klass, tenant, tokens, now)
        self.entries[entry.handle] = entry
        self.fate[entry.handle] = "waiting"
        self.admitted_before[entry.handle] = len(self.admitted)
        outcome = self.queues.offer(entry, self.slots())
        if outcome is ADMIT:
            self._admit(entry, now)
        elif isinstance(outcome, Queue):
            if (out := outcome.displaced) is not None:  # from a class below, or a heavier tenant
                rank = self.config.get(entry.klass).rank
                assert self.config.get(out.klass).rank > rank or out.tenant != entry.tenant
                assert self.config.get(out.klass).rank >= rank
                self._settle(out, "displaced")
            self.pump(now)
        else:
            self._settle(entry, "shed")
        return entry

    def fated(self, fate: str) -> list[Entry[int]]:
        return [self.entries[h] for h, f in self.fate.items() if f == fate]

    def finish(self, entry: Entry[int], now: float) -> None:
        del self.running[entry.handle]
        self.fate[entry.handle] = "done"
        self.pump(now)

    def leave(self, entry: Entry[int], now: float) -> None:
        if self.queues.remove(entry):
            self._settle(entry, "left")
        self.pump(now)

    def pump(self, now: float) -> None:
        for gone in self.queues.expired(now):
            self._settle(gone, "expired")
        while (entry := self.queues.next(now, self.slots())) is not None:
            assert now < self.queues.deadline(entry), "admitted past its deadline"
            self._admit(entry, now)

    def _admit(self, entry: Entry[int], now: float) -> None:
        slots = self.slots()
        assert fits(self.config.ranked, entry.klass, slots.capacity, slots.used)
        for waiter in self.queues:  # strict order: nobody more important could have gone
            more = self.config.get(waiter.klass).rank < self.config.get(entry.klass).rank
            assert not (more and self.fate[waiter.handle] == "waiting"), (waiter, entry)
        self.running[entry.handle] = entry
        self.admitted.append(entry)
        self.admitted_at[entry.handle] = now
        self._settle(entry, "admitted")

    def _settle(self, entry: Entry[int], fate: str) -> None:
        assert self.fate[entry.handle] == "waiting", (entry, self.fate[entry.handle], fate)
        self.fate[entry.handle] = fate
