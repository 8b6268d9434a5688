"""Reading the processes from outside: the gateway's /metrics, /proc counters, free ports.

The gateways run in processes of their own (pinned apart from this harness), so their state
is only visible the way an operator sees it: a Prometheus scrape.
"""

from __future__ import annotations

import math
import os
import re
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.bench.processes import CLK_TCK, cpu_ticks

SCRAPE_TIMEOUT_S = 10.0
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def scrape(metrics_url: str) -> list[Sample]:
    """A hand parser: the 1,000-unit exposition is ~25k lines, polled while waiting."""
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=SCRAPE_TIMEOUT_S) as resp:
        text: str = resp.read().decode()
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        samples.append(Sample(name, dict(_LABEL.findall(labels)), float(value)))
    return samples


def by_unit(samples: Sequence[Sample], name: str) -> dict[str, float]:
    return {s.labels.get("unit", ""): s.value for s in samples if s.name == name}


def total(samples: Sequence[Sample], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def count(samples: Sequence[Sample], name: str, value: float) -> int:
    return sum(1 for s in samples if s.name == name and s.value == value)


def wait_for(
    check: Callable[[], bool], within: float, every: float, what: str, alive: Callable[[], None]
) -> float:
    """Polls `check` until true; `alive` raises if a process died, so a crash is not a timeout."""
    start = time.monotonic()
    for _ in range(int(within / every) + 2):
        alive()
        if check():
            return time.monotonic() - start
        if time.monotonic() - start > within:
            break
        time.sleep(every)
    raise RuntimeError(f"{what}: not within {within:g} s")


def ensure_alive(*pids: int) -> None:
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat")
        # A reaped child has no /proc entry; a zombie (state Z) has exited but not been reaped.
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            raise RuntimeError(f"process {pid} exited")


@dataclass(frozen=True)
class Counters:
    """CPU and syscall I/O of one process at one instant."""

    ticks: int
    rchar: int
    wchar: int

    def cpu_s(self, later: Counters) -> float:
        return (later.ticks - self.ticks) / CLK_TCK


def counters(pid: int) -> Counters:
    """rchar/wchar count bytes passed through read()/write(), which libuv uses for TCP."""
    io = dict(
        line.split(": ", 1) for line in Path(f"/proc/{pid}/io").read_text().splitlines() if line
    )
    return Counters(cpu_ticks(pid), int(io["rchar"]), int(io["wchar"]))


@dataclass(frozen=True)
class CoreTicks:
    """One CPU's /proc/stat times: what ran there, whoever it was."""

    task: int  # user + nice + system: processes, ours and everybody else's
    irq: int  # irq + softirq: much of it loopback TCP for our processes
    steal: int  # taken by the hypervisor

    def share(self, later: CoreTicks, seconds: float) -> dict[str, float]:
        per_s = CLK_TCK * seconds
        return {
            "task": (later.task - self.task) / per_s,
            "irq": (later.irq - self.irq) / per_s,
            "steal": (later.steal - self.steal) / per_s,
        }


def cores(merge: bool) -> dict[str, CoreTicks]:
    """The machine is shared: CPU time not charged to our processes is somebody else's load.

    Unpinned processes wander between CPUs, so then only the machine-wide sum means anything.
    """
    found = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and (name == "cpu") == merge:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
            found["all" if merge else name] = CoreTicks(user + nice + system, irq + softirq, steal)
    return found


def foreign(
    before: dict[str, CoreTicks],
    after: dict[str, CoreTicks],
    ours: dict[str, float],
    seconds: float,
) -> dict[str, dict[str, float]]:
    """Per CPU: task time (in cores) minus `ours` (cores used there by our processes)."""
    report = {}
    for cpu, start in before.items():
        share = start.share(after[cpu], seconds)
        share["ours"] = ours.get(cpu, 0.0)
        share["other"] = share["task"] - share["ours"]
        report[cpu] = share
    return report


def wait_quiet(within: float, below: float, seconds: int = 5) -> dict[str, float | bool]:
    """Waits, at most `within` s, for `seconds` seconds running in which the machine did less
    than `below` cores of work: on a shared 2-core box another session's burst starves the
    gateway and times probes out, and then the run measures that session."""
    started = time.monotonic()
    quiet, load, before = 0, 0.0, cores(merge=True)["all"]
    for _ in range(int(within) + 1):
        if quiet >= seconds or time.monotonic() - started >= within:
            break
        time.sleep(1.0)
        after = cores(merge=True)["all"]
        load = before.share(after, 1.0)["task"]
        quiet, before = (quiet + 1 if load < below else 0), after
    waited = time.monotonic() - started
    return {"waited_s": round(waited, 1), "quiet": quiet >= seconds, "last_second_cores": load}


@dataclass(frozen=True)
class Group:
    """CPU of this harness, its reaped children and some live processes, at one instant."""

    own_s: float
    reaped_s: float
    live: dict[int, int]  # pid -> ticks


def group(pids: Sequence[int]) -> Group:
    t = os.times()
    live = {pid: cpu_ticks(pid) for pid in pids}
    return Group(t.user + t.system, t.children_user + t.children_system, live)


def group_cpu_s(a: Group, b: Group) -> float:
    """Killed followers come and go: a reaped one's lifetime is in the children's times, so
    what it had used by `a` is taken back out, and one started after `a` counts in full."""
    gone = sum(ticks for pid, ticks in a.live.items() if pid not in b.live) / CLK_TCK
    live = sum(ticks - a.live.get(pid, 0) for pid, ticks in b.live.items()) / CLK_TCK
    return (b.own_s - a.own_s) + (b.reaped_s - a.reaped_s - gone) + live


def pct(values: Sequence[float], q: float) -> float:
    """Nearest rank, so a reported percentile is a time some trial really saw."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "min": min(values, default=math.nan),
        "median": pct(values, 0.5),
        "p90": pct(values, 0.9),
        "max": max(values, default=math.nan),
    }
