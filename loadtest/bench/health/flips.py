"""The probing gateway's health flips, read from its log instead of its /metrics.

At 1,000 units a scrape blocks the gateway's loop past the probe timeout and so causes the
flips it would count. Each flip is also one INFO event line (steady state logs nothing), so
a gateway started at `--log-level info` with stderr kept in a file has a timestamped record
of every flip that costs nothing to read.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gateway.base.readyfile import wait_ready_blocking
from loadtest.bench.processes import READY_TIMEOUT_S, pinned, stop_child

# "2026-11-29 20:42:55,017 INFO unitgate.events: unit u942: unhealthy (...) by prober"
_EVENT = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO unitgate\.events: unit (\S+): "
    r"(healthy|slow|unhealthy) \((.*)\) by prober$"
)
_ADDRESS = re.compile(r" \((?:leader|follower) http://[^)]*\)")


@dataclass(frozen=True)
class Flip:
    at: float  # wall clock, time.time()
    unit: str
    healthy: bool  # routable by health: healthy or slow
    reason: str

    @property
    def first(self) -> bool:
        """A unit's first verdict (units start unknown): start-up, not a flip to count."""
        return self.reason.startswith("first probe round")


@contextlib.contextmanager
def logged_child(
    argv: list[str], ready: Path, cpu: int | None, what: str, log: Path
) -> Iterator[dict[str, Any]]:
    """processes.child with stderr kept in `log` (thousands of flip lines must not reach the
    terminal); the same pinning, readiness and stopping."""
    with log.open("wb") as err, pinned(cpu):
        proc = subprocess.Popen(
            [sys.executable, "-m", *argv], stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        yield wait_ready_blocking(ready, proc, READY_TIMEOUT_S, what)
    finally:
        stop_child(proc)


def read(log: Path) -> list[Flip]:
    flips = []
    for line in log.read_text(errors="replace").splitlines():
        match = _EVENT.match(line)
        if match is None:
            continue
        stamp, unit, what, reason = match.groups()
        at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local, as logged
        flips.append(Flip(at, unit, what != "unhealthy", reason))
    return flips


def routable(flips: list[Flip]) -> set[str]:
    """Units start unknown, so a unit is routable exactly when its last flip let it in."""
    last = {f.unit: f.healthy for f in flips}
    return {unit for unit, healthy in last.items() if healthy}


def between(flips: list[Flip], start: float, end: float) -> int:
    return sum(1 for f in flips if start <= f.at < end and not f.first)


def timeline(flips: list[Flip], origin: float) -> dict[str, int]:
    """Flips per whole second from `origin` (negative: before it), for the JSON."""
    seconds = Counter(int((f.at - origin) // 1) for f in flips if not f.first)
    return {str(s): n for s, n in sorted(seconds.items())}


def reasons(flips: list[Flip], top: int = 5) -> dict[str, int]:
    """Why units went unhealthy, addresses stripped so that alike reasons add up."""
    said = Counter(_ADDRESS.sub("", f.reason) for f in flips if not f.healthy)
    return dict(said.most_common(top))
