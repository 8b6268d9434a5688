"""Per-unit state of the simulated units (a test tool): settings, faults, health modes, stats.

Kept free of I/O and asyncio so the rules that tests and the gateway rely on (when a
counted fault runs out, which requests a fault at a rate strikes, what a reset keeps) live in
one place and can be read on their own.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from enum import StrEnum


class FaultMode(StrEnum):
    NONE = "none"
    ERROR = "error"
    REFUSE = "refuse"
    HANG = "hang"
    STALL = "stall"
    DROP = "drop"


class ToolsMode(StrEnum):
    """How a unit answers a request that offers tools; the last two stand for a broken revision."""

    CALL = "call"  # a tool call whose arguments fit the tool's schema
    TEXT = "text"  # plain text, as a model that lost the skill
    BAD_JSON = "bad_json"  # a tool call whose arguments are not valid JSON


class HealthMode(StrEnum):
    OK = "ok"
    UNHEALTHY = "unhealthy"
    UNRESPONSIVE = "unresponsive"
    SLOW = "slow"


@dataclass(frozen=True, slots=True)
class Settings:
    ttft_ms: float = 20.0
    itl_ms: float = 10.0
    tokens: int = 16
    tools: ToolsMode = ToolsMode.CALL
    variant: str = ""
    """Changes the answer's words, deterministically: units with one variant answer alike."""
    stall_rate: float = 0.0
    """The share of requests whose first token comes `stall_ms` late (a straggler)."""
    stall_ms: float = 0.0

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class Fault:
    """What the leader does to the next requests; `count=None` means until cleared.

    With a `rate` the fault strikes that share of requests, drawn from a generator seeded
    with `seed` when the fault is set (`None`: a fresh random sequence); the others run
    normally. `rate` and `count` do not combine (see params.py).
    """

    mode: FaultMode = FaultMode.NONE
    count: int | None = None
    status: int = 500
    after_tokens: int = 2
    rate: float | None = None
    seed: int | None = None

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


NO_FAULT = Fault()


@dataclass(frozen=True, slots=True)
class NodeHealth:
    mode: HealthMode = HealthMode.OK
    delay_ms: float = 0.0

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class Stats:
    """Counters since the last reset, plus the gauges `in_flight` and `step` (and the most
    in flight at once, `peak_in_flight`: what a gateway's cap must bound).

    `cancelled` counts requests whose client went away (including while hung or
    stalled); `failed` counts requests answered with an injected error or drop.
    """

    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0  # the most in flight at once since the last reset
    last_cancel_time: float | None = None
    step: int = 0

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class UnitState:
    unit_id: str
    defaults: Settings
    settings: Settings
    health: list[NodeHealth]
    fault: Fault = NO_FAULT
    stats: Stats = field(default_factory=Stats)
    strikes: random.Random = field(default_factory=random.Random)
    """Decides which requests a fault at a rate strikes; re-seeded whenever a fault is set."""

    @classmethod
    def new(cls, unit_id: str, node_count: int, defaults: Settings) -> UnitState:
        return cls(unit_id, defaults, defaults, [NodeHealth()] * node_count)

    def admit(self) -> Fault:
        """Count a new request and return the fault it must suffer.

        A counted fault is consumed here, at admission, so "the next N requests" means
        the next N to arrive regardless of how long each one takes to finish. A fault at
        a rate draws once per admitted request, in arrival order, so a seed fixes which
        of the requests it strikes.
        """
        self.stats.requests += 1
        self.stats.in_flight += 1
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, self.stats.in_flight)
        fault = self.fault
        if fault.rate is not None:
            return fault if self.strikes.random() < fault.rate else NO_FAULT
        if fault.count is not None:
            left = fault.count - 1
            self.fault = dataclasses.replace(fault, count=left) if left > 0 else NO_FAULT
        return fault

    def set_fault(self, fault: Fault) -> None:
        self.fault = fault
        self.strikes = random.Random(fault.seed)

    def finish_completed(self) -> None:
        self.stats.in_flight -= 1
        self.stats.completed += 1

    def finish_failed(self) -> None:
        self.stats.in_flight -= 1
        self.stats.failed += 1

    def finish_cancelled(self, wall_time: float) -> None:
        self.stats.in_flight -= 1
        self.stats.cancelled += 1
        self.stats.last_cancel_time = wall_time

    def reset(self) -> None:
        """Back to defaults; `in_flight` and `step` are gauges of live work, so they survive.

        Zeroing `in_flight` would drive it negative as running requests finish, and a
        step counter going backwards would look like an engine restart to the gateway.
        """
        self.settings = self.defaults
        self.fault = NO_FAULT
        self.health = [NodeHealth()] * len(self.health)
        live = self.stats.in_flight
        self.stats = Stats(in_flight=live, peak_in_flight=live, step=self.stats.step)
