"""Gang health of one unit: from probe rounds to "usable or not", with hysteresis.

A unit is one engine spread over several nodes, so it is only usable while every node is
healthy, each node is the one the config says it is, and the engine makes progress. One bad
round (a dropped packet, a GC pause) must not eject a unit, and one good round after a crash
must not readmit it: `fall` bad rounds in a row mark it down, `rise` good ones mark it up.
A probe that times out is the one soft piece of evidence (states.py says why).

Pure and synchronous, with the clock passed in, so every rule runs on a fake clock in tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.health.result import NodeReport
from gateway.health_states import Health, Outcome


@dataclass(frozen=True, slots=True)
class Flip:
    """A change the prober applies once: a new state, or a new kind of evidence (`hard`)."""

    health: Health
    reason: str
    hard: bool = False

    @property
    def healthy(self) -> bool:
        return self.health.routable


@dataclass(frozen=True, slots=True)
class Round:
    """`nodes[rank]` is that node's problem (None = fine); `problem` says why the round is not
    good; `hard` whether any of it is hard evidence."""

    nodes: tuple[str | None, ...]
    problem: str | None
    outcome: Outcome
    hard: bool
    flip: Flip | None


_RANK = {Health.UNHEALTHY: 0, Health.SLOW: 1, Health.HEALTHY: 2}
_TARGET = {Outcome.BAD: Health.UNHEALTHY, Outcome.SLOW: Health.SLOW, Outcome.GOOD: Health.HEALTHY}


class HealthMachine:
    """Hysteresis over three kinds of round (pingora's counter shape, one level more).

    States are ordered unhealthy < slow < healthy, rounds bad < slow < good. `fall` rounds in a
    row below the state move it down, `rise` rounds in a row above it move it up, each to the
    state of the last round. A unit never routable since start-up has nothing to protect: its
    first good round makes it healthy at once, its bad rounds mark it unhealthy at once.
    """

    __slots__ = ("downs", "fall", "hard", "rise", "seen", "state", "ups")

    def __init__(self, fall: int, rise: int, state: Health = Health.UNKNOWN) -> None:
        self.fall, self.rise, self.state = fall, rise, state
        self.hard = False
        self.seen = state.routable  # routable at some point: from then on hysteresis applies
        self.ups = self.downs = 0

    def observe(self, outcome: Outcome, hard: bool) -> bool:
        """Returns True when the state (or, while unhealthy, the kind of evidence) changed."""
        target = _TARGET[outcome]
        if not self.seen:
            return self._move(target, hard)
        have, got = _RANK[self.state], _RANK[target]
        if got == have:
            self.ups = self.downs = 0
            return target is Health.UNHEALTHY and self._move(target, hard)
        if got > have:
            self.ups, self.downs = self.ups + 1, 0
            return self.ups >= self.rise and self._move(target, hard)
        self.ups, self.downs = 0, self.downs + 1
        return self.downs >= self.fall and self._move(target, hard)

    def _move(self, state: Health, hard: bool) -> bool:
        hard = hard and state is Health.UNHEALTHY
        if state is self.state and hard == self.hard:
            return False
        self.state, self.hard = state, hard
        self.seen = self.seen or state.routable
        self.ups = self.downs = 0
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

    def observe(
        self, step: int | None, pending: int | None, now: float, shown: int | None = None
    ) -> str | None:
        """`step` is what must move (a progress fingerprint where the step count alone can
        stand still while the engine works); `shown` the step count the message names."""
        if step is None or pending is None:
            return None  # the leader did not answer: that round is bad for another reason
        busy = pending > 0
        if step != self.step or (busy and not self.pending):
            self.step, self.since = step, now
        self.pending = busy
        frozen_for = now - self.since
        if busy and frozen_for > self.timeout:
            return (
                f"engine stalled: step {step if shown is None else shown} unchanged for"
                f" {frozen_for:.1f} s"
                f" with {pending} pending"
            )
        return None


class GangVerdict:
    """Judges each probe round of one unit; the prober applies the flips it returns.

    A probe timeout is soft evidence: a saturated leader answers `/health` late while it
    serves. It makes the round `slow` when the caller says the unit's live traffic flows, and
    bad (but soft) when nothing vouches for the unit. Everything else a node can report is hard.

    A `slow` unit gets only a share of new requests (`slow_weight`), so gaps in its traffic
    grow by the inverse of that share; judged by the plain window, the down-weighting itself
    would starve the unit of the evidence that keeps it in (CI saw it: no new stream on a slow
    unit for 2 s, then ejected). So while it is slow, traffic seen flowing within `slow_grace`
    still vouches for a leader whose probes time out. Not for a follower's: its leader answers
    and the caller asks for progress since the probes went out, which a frozen follower's
    unit cannot make however recently it served. Hard evidence (and a stalled engine) ejects
    it as before.

    Traffic through this gateway is not the only witness: a stock vLLM loaded by other clients
    answers `/health` late just the same. Its leader's own report (`NodeReport.busy_at`: work
    running or waiting, progress changed between its last two reads) vouches for it like
    flowing traffic while the report is at most `report_window` old, measured from when it was
    read, not from the round that carries it. A report past that, or one whose progress stood
    still, vouches for nothing, so a frozen leader is ejected once its last report ages out;
    and no grace: the slow weight starves the unit of this gateway's traffic, not of its
    engine's work.
    """

    def __init__(
        self,
        unit_id: str,
        urls: Sequence[str],
        *,
        fall: int,
        rise: int,
        stall_timeout: float,
        state: Health = Health.UNKNOWN,
        slow_grace: float = 0.0,
        report_window: float = 0.0,
    ) -> None:
        self.unit_id = unit_id
        self.slow_grace = slow_grace
        self.report_window = report_window
        self.flowed_at: float | None = None  # when a round last found the traffic flowing
        self.labels = tuple(f"node {rank} ({_role(rank)} {url})" for rank, url in enumerate(urls))
        self.machine = HealthMachine(fall, rise, state)
        self.stall = StallWatch(stall_timeout)

    @property
    def health(self) -> Health:
        return self.machine.state

    def observe(
        self,
        reports: Sequence[NodeReport],
        now: float,
        canary: str | None = None,
        flowing: bool = False,
        lagging: str | None = None,
        asked: bool = False,
    ) -> Round:
        """`reports[rank]` for every node; `canary` is a failed canary's error, if one ran;
        `flowing` whether the unit's live traffic is arriving at its own pace right now;
        `lagging` why its learned latency lags the fleet's, if it does (a round that finds
        nothing else wrong is then slow, for that reason); `asked` whether a canary sent
        after the probes went out answered (`wants_canary`)."""
        nodes = tuple(self._node_problem(rank, r) for rank, r in enumerate(reports))
        bad = [f"{self.labels[rank]}: {p}" for rank, p in enumerate(nodes) if p is not None]
        hard = any(p is not None and not r.timed_out for p, r in zip(nodes, reports, strict=True))
        leader = reports[0]
        if not leader.fresh:
            stalled = None  # the same reading as before: it says nothing new about progress
        elif leader.progress is None:
            stalled = self.stall.observe(leader.step, leader.pending, now)
        else:
            stalled = self.stall.observe(leader.progress, leader.pending, now, leader.step)
        if stalled is not None:
            bad.append(stalled)
        if canary is not None:
            bad.append(f"canary completion failed: {canary}")
        hard = hard or stalled is not None or canary is not None
        problem = "; ".join(bad) if bad else None
        if flowing:
            self.flowed_at = now
        traffic = flowing or (
            leader.timed_out
            and self.machine.state is Health.SLOW
            and self.flowed_at is not None
            and now - self.flowed_at <= self.slow_grace
        )
        working = leader.timed_out and engine_working(leader, now, self.report_window)
        if traffic:
            why = "its traffic flows"
        elif asked:
            why, traffic = "a canary completion answered", True
        else:
            why = "its engine reports work moving"
        if problem is None:  # nothing wrong with its nodes: slow only if its latency lags
            outcome = Outcome.GOOD if lagging is None else Outcome.SLOW
            flip = self._flip(outcome, False, "", lagging or "")
            return Round(nodes, lagging, outcome, False, flip)
        outcome = Outcome.BAD if hard or not (traffic or working) else Outcome.SLOW
        if outcome is Outcome.BAD and not hard:
            report = leader.timed_out and self.report_window > 0  # a kind that could have said
            witness = ", nor a fresh report of its engine working," if report else ""
            problem = f"{problem}; no live traffic on the unit{witness} to vouch for it"
        slow = f"probes time out while {why}: {problem}"
        return Round(nodes, problem, outcome, hard, self._flip(outcome, hard, problem, slow))

    def wants_canary(self, reports: Sequence[NodeReport], flowing: bool, idle: bool) -> bool:
        """Whether to ask the unit directly before judging this round: a follower's probe
        timed out while its leader answered, on a unit already `slow` that had no stream of
        ours in flight when the probes went out (`idle`), and nothing else is wrong. Such a
        unit cannot show progress since the probes went out, because its slow weight itself
        starves it of new streams (CI saw it: a wave of streams with none on the slow unit,
        then ejected for "no live traffic"); a 1-token completion needs every node, so its
        answer vouches for the follower, and its failure is hard evidence. A unit with
        streams in flight that made no progress is judged by them, at once."""
        if self.machine.state is not Health.SLOW or flowing or not idle:
            return False
        if reports[0].timed_out or not any(r.timed_out for r in reports[1:]):
            return False
        return all(r.timed_out or self._node_problem(k, r) is None for k, r in enumerate(reports))

    def _flip(self, outcome: Outcome, hard: bool, problem: str, slow: str = "") -> Flip | None:
        """`slow`: the reason a move to `slow` gives."""
        first = not self.machine.seen
        if not self.machine.observe(outcome, hard):
            return None
        state = self.machine.state
        if state is Health.HEALTHY:
            nodes = len(self.labels)
            if first:
                return Flip(state, f"first probe round: all {nodes} nodes ok")
            return Flip(state, f"all {nodes} nodes ok for {self.machine.rise} rounds")
        if state is Health.SLOW:
            return Flip(state, slow)
        return Flip(state, problem, self.machine.hard)

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


def engine_working(leader: NodeReport, now: float, window: float) -> bool:
    """Whether the leader's own report shows its engine working (requests running or waiting,
    progress changed since the report before) and was read at most `window` seconds ago."""
    return leader.busy_at is not None and now - leader.busy_at <= window


def _role(rank: int) -> str:
    return "leader" if rank == 0 else "follower"
