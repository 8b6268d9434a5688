"""Settings of priority classes: `[priority]` and its `[[priority.classes]]`.

A class is a rank (lower = more important, served first), a share of the gateway's slots held
back from less important classes, a wait queue of its own, and the `priority` value the units
are sent (vLLM's field and the builtin engine's: lower = scheduled sooner). The policy that
uses them is gateway/routing/classes.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from gateway.config.builder import build
from gateway.config.checks import check

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")  # header-safe, compared in lower case
_INT32 = (-(2**31), 2**31 - 1)  # the builtin engine's `priority` bound (and vLLM's int)


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    rank: int  # lower = more important; unique
    reserved_share: float = 0.0  # of the gateway's slots, held back from less important classes
    queue_size: int = 1024
    queue_timeout: float = 5.0  # seconds a request of this class may wait for a slot
    unit_priority: int = 0  # sent as `priority` to units that schedule by it
    # Seconds to first token the class aims at: units predicted to miss it are avoided
    # (gateway/routing/timely.py; None = no target).
    ttft_slo: float | None = None
    # When every unit is predicted to miss `ttft_slo`: refuse the request (429, Retry-After)
    # rather than send it to the unit predicted to answer soonest.
    shed_on_slo: bool = False
    # Whether the class's streamed requests are hedged: sent to a second unit too when the
    # first has not answered its first token in time ([hedge] says when and how much).
    hedge: bool = False

    def __post_init__(self) -> None:
        check(bool(_NAME.fullmatch(self.name)), "name", self.name, "must match [a-z0-9][a-z0-9_-]*")
        check(self.rank >= 0, "rank", self.rank, "must be >= 0")
        check(
            0.0 <= self.reserved_share < 1.0,
            "reserved_share",
            self.reserved_share,
            "must be in [0, 1)",
        )
        check(self.queue_size >= 0, "queue_size", self.queue_size, "must be >= 0")
        check(
            0.0 <= self.queue_timeout < math.inf,
            "queue_timeout",
            self.queue_timeout,
            "must be >= 0 and finite (a lower class waits a bounded time)",
        )
        check(
            self.ttft_slo is None or 0.0 < self.ttft_slo < math.inf,
            "ttft_slo",
            self.ttft_slo,
            "must be > 0 and finite (seconds)",
        )
        check(
            not self.shed_on_slo or self.ttft_slo is not None,
            "shed_on_slo",
            self.shed_on_slo,
            "needs the class's ttft_slo (the target a request would be shed for missing)",
        )
        check(
            _INT32[0] <= self.unit_priority <= _INT32[1],
            "unit_priority",
            self.unit_priority,
            "must fit in 32 bits",
        )


# Why these defaults:
# - interactive holds back 20% of the slots: its requests are few and a person waits on each,
#   so a burst of them starts at once instead of waiting for anything to finish. The cost is
#   paid only at saturation with no interactive traffic: the other classes use 80% then.
# - standard (every request that asks for no class) holds back nothing: strict order already
#   gives it every freed slot before batch, and a slot frees every (request duration /
#   capacity) seconds; a reservation would idle slots a batch-only night could use.
# - batch holds back nothing (it is the least important: there is nobody to hold back from).
#   It may wait a minute, because its clients would rather wait than retry, and that costs the
#   others nothing: at saturation its newest waiters are the first displaced.
# - interactive and standard keep today's [admission] defaults (5 s, 1024 for standard).
# - unit_priority: standard is 0, the engines' default, so a unit sees a standard request as it
#   sees one without the field; the others sit one step either side.
# - hedge: a person waits on each interactive request, and they are few: worth a second copy
#   when the first unit stalls. Standard and batch requests are many, and nobody watches
#   their first token.
DEFAULT_CLASSES = (
    PriorityClass(
        "interactive", 0, 0.2, queue_size=256, queue_timeout=5.0, unit_priority=-1, hedge=True
    ),
    PriorityClass("standard", 1, 0.0, queue_size=1024, queue_timeout=5.0, unit_priority=0),
    PriorityClass("batch", 2, 0.0, queue_size=1024, queue_timeout=60.0, unit_priority=1),
)


@dataclass(frozen=True, slots=True)
class PriorityConfig:
    # Replaced as a whole by the file's [[priority.classes]], if it has any.
    classes: tuple[PriorityClass, ...] = DEFAULT_CLASSES
    # The class of a request that asks for none (and of any request without auth).
    default: str = "standard"
    # A queued request of the most important class may displace a request of the least
    # important one that has not yet sent its first byte (it gets 503 and Retry-After). Off:
    # the displaced request's prefill is lost work.
    preempt: bool = False

    @property
    def ranked(self) -> tuple[PriorityClass, ...]:
        """The classes, most important first."""
        return tuple(sorted(self.classes, key=lambda c: c.rank))

    def __post_init__(self) -> None:
        check(len(self.classes) > 0, "classes", self.classes, "must list at least one class")
        names = [c.name for c in self.classes]
        ranks = [c.rank for c in self.classes]
        check(len(set(names)) == len(names), "classes", _repeated(names), "must have unique names")
        check(len(set(ranks)) == len(ranks), "classes", _repeated(ranks), "must have unique ranks")
        check(
            self.default in names,
            "default",
            self.default,
            f"must name a class of {list(dict.fromkeys(names))}",
        )
        ranked = self.ranked
        if not ranked:
            return
        reserved = sum(c.reserved_share for c in ranked)
        check(
            reserved < 1.0,
            "classes",
            reserved,
            "must reserve less than 1 in all (the sum of reserved_share)",
        )
        last = ranked[-1]
        check(
            last.reserved_share == 0.0,
            "classes",
            f"{last.name}.reserved_share = {last.reserved_share}",
            "must give its least important class reserved_share = 0 (nobody ranks below it)",
        )
        for more, less in pairwise(ranked):
            check(
                more.unit_priority <= less.unit_priority,
                "classes",
                f"{more.name}.unit_priority = {more.unit_priority} > "
                f"{less.name}.unit_priority = {less.unit_priority}",
                "must not give a more important class a larger unit_priority (lower = sooner)",
            )

    def get(self, name: str) -> PriorityClass:
        for c in self.classes:
            if c.name == name:
                return c
        raise KeyError(name)

    def resolve(self, asked: str | None, highest: str | None = None, default: str = "") -> str:
        """The class a request runs in: `asked` (the `x-unitgate-priority` header, any case),
        or `default` (its key's; "" = this config's), never above `highest` (its key's top
        class; None = any). An unknown `asked` raises KeyError (the caller answers 400)."""
        name = asked.strip().lower() if asked else (default or self.default)
        wanted = self.get(name)
        if highest is not None and wanted.rank < self.get(highest).rank:
            return highest
        return name


def from_toml(table: Any, where: str = "priority") -> PriorityConfig:
    """`[priority]` from its TOML table; one ConfigError naming every bad key and value."""
    built: PriorityConfig = build(PriorityConfig, table, where)
    return built


def _repeated(values: list[Any]) -> list[Any]:
    return sorted({v for v in values if values.count(v) > 1})
