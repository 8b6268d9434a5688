"""Gang health of one unit: from probe rounds to "usable or not", with hysteresis.

A unit is one engine spread over several nodes, so it is only usable while every node is
healthy, each node is the one the config says it is, and the engine makes progress. One bad
round (a dropped packet, a GC pause) must not eject a unit, and one good round after a crash
must not readmit it: `fall` bad rounds in a row mark it down, `rise` good ones mark it up.

Pure and synchronous, with the clock passed in, so every rule runs on a fake clock in tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.health.result import NodeReport


@dataclass(frozen=True, slots=True)
class Flip:
    healthy: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Round:
    """`nodes[rank]` is that node's problem (None = fine); `problem` says why the round is bad."""

    nodes: tuple[str | None, ...]
    problem: str | None
    flip: Flip | None


class Hysteresis:
    """Counts consecutive rounds that disagree with the current state (pingora's shape)."""

    __slots__ = ("counter", "fall", "healthy", "rise")

    def __init__(self, fall: int, rise: int, healthy: bool) -> None:
        self.fall, self.rise, self.healthy = fall, rise, healthy
        self.counter = 0

    def observe(self, ok: bool) -> bool:
        """Returns True when this round flipped the state."""
        if ok == self.healthy:
            self.counter = 0
            return False
        self.counter += 1
        if self.counter < (self.rise if ok else self.fall):
            return False
        self.healthy, self.counter = ok, 0
        return True


class StallWatch:
    """A hung collective looks healthy on every node: only a step that stops moving shows it.

    The clock restarts whenever the step changes or work arrives at an idle leader, so a unit
    that simply had nothing to do is never called stalled.
    """

    __slots__ = ("pending", "since", "step", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.step: int | None = None
        self.pending = False
        self.since = 0.0

    def observe(self, step: int | None, pending: int | None, now: float) -> str | None:
        if step is None or pending is None:
            return None  # the leader did not answer: that round is bad for another reason
        busy = pending > 0
        if step != self.step or (busy and not self.pending):
            self.step, self.since = step, now
        self.pending = busy
        frozen_for = now - self.since
        if busy and frozen_for > self.timeout:
            return (
                f"engine stalled: step {step} unchanged for {frozen_for:.1f} s"
                f" with {pending} pending"
            )
        return None


class GangVerdict:
    """Judges each probe round of one unit; the prober applies the flips it returns."""

    def __init__(
        self,
        unit_id: str,
        urls: Sequence[str],
        *,
        fall: int,
        rise: int,
        stall_timeout: float,
        healthy: bool,
    ) -> None:
        self.unit_id = unit_id
        self.labels = tuple(f"node {rank} ({_role(rank)} {url})" for rank, url in enumerate(urls))
        self.state = Hysteresis(fall, rise, healthy)
        self.stall = StallWatch(stall_timeout)

    @property
    def healthy(self) -> bool:
        return self.state.healthy

    def observe(
        self, reports: Sequence[NodeReport], now: float, canary: str | None = None
    ) -> Round:
        """`reports[rank]` for every node; `canary` is a failed canary's error, if one ran."""
        nodes = tuple(self._node_problem(rank, r) for rank, r in enumerate(reports))
        bad = [f"{self.labels[rank]}: {p}" for rank, p in enumerate(nodes) if p is not None]
        leader = reports[0]
        stalled = self.stall.observe(leader.step, leader.pending, now)
        if stalled is not None:
            bad.append(stalled)
        if canary is not None:
            bad.append(f"canary completion failed: {canary}")
        problem = "; ".join(bad) if bad else None
        return Round(nodes, problem, self._flip(problem))

    def _flip(self, problem: str | None) -> Flip | None:
        if not self.state.observe(problem is None):
            return None
        if problem is not None:
            return Flip(False, problem)
        nodes = len(self.labels)
        return Flip(True, f"all {nodes} nodes ok for {self.state.rise} rounds")

    def _node_problem(self, rank: int, report: NodeReport) -> str | None:
        if report.error is not None:
            return report.error
        if report.status != "ok":
            return f"status {report.status!r}"
        if report.unit != self.unit_id:
            return f"reports unit {report.unit}, expected {self.unit_id}"
        if report.rank != rank:
            return f"reports rank {report.rank}, expected {rank}"
        if report.role != _role(rank):
            return f"reports role {report.role}, expected {_role(rank)}"
        return None


def _role(rank: int) -> str:
    return "leader" if rank == 0 else "follower"
