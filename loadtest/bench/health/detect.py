"""Detection time: u0's follower killed or frozen in a process of its own, /metrics polled.

A kill closes the follower's sockets (probes are refused at once); a freeze leaves the
kernel accepting connections that are never answered (probes time out). Faults land at a
random phase of the probe rounds, so the spread covers the lucky and the unlucky timing.
Times are upper bounds: the scrape that first shows the change returned after it happened;
`lower_s` is when the scrape before it was sent, so the change happened in between.

This part reaches inside the gateway on purpose, past gateway.api: what it measures is the
health detector at its default settings, so it reads those defaults (interval, timeout, fall,
rise) from gateway.config.HealthConfig itself, and the report cannot drift from the code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from random import Random
from typing import Any

from gateway.base.ports import free_port
from gateway.config import HealthConfig
from loadtest.bench.health.observe import (
    CoreTicks,
    Group,
    by_unit,
    cores,
    count,
    ensure_alive,
    foreign,
    group,
    group_cpu_s,
    scrape,
    spread,
    total,
    wait_for,
)
from loadtest.bench.health.scale import unit_table
from loadtest.bench.processes import CLK_TCK, Pins, child, cpu_ticks

POLL_S = 0.01
FAULT_WITHIN_S = 5.0  # well past both targets: a miss is measured, not timed out
BACK_WITHIN_S = 15.0  # a restarted follower imports the simulator before it listens
GATEWAY_TOML = """\
[gateway]
port = 0
[metrics]
port = 0
[admin]
enabled = false
"""


@dataclass(frozen=True)
class Seen:
    """When a scrape first showed the awaited state, in seconds after the fault or fix."""

    at_s: float
    lower_s: float
    scrapes: int


@dataclass
class Trials:
    kill: list[Seen] = field(default_factory=list)
    kill_readmitted: list[Seen] = field(default_factory=list)  # from the restart, informative
    freeze: list[Seen] = field(default_factory=list)
    recovery: list[Seen] = field(default_factory=list)  # from SIGCONT
    # u1's transitions after its first judgement (unknown -> healthy, at start-up): a fault
    # of u0 must not touch it
    bystander_flips: float = 0.0
    u0_down_flips: float = 0.0  # one per trial, or u0 flapped on its way back
    first_probed_s: float = 0.0
    seed: int = 0
    settings: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0  # from the first probes to the last trial
    cores: dict[str, dict[str, float]] = field(default_factory=dict)  # see scale.Scale

    def summary(self) -> dict[str, dict[str, float]]:
        return {
            name: spread([s.at_s for s in seen])
            for name, seen in (
                ("kill", self.kill),
                ("freeze", self.freeze),
                ("recovery", self.recovery),
                ("kill_readmitted", self.kill_readmitted),
            )
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"summary": self.summary()}


class Follower:
    """u0's follower; each incarnation is a `child` of its own, since a kill ends one."""

    def __init__(self, tmp: Path, config: Path, cpu: int | None) -> None:
        self.tmp, self.config, self.cpu = tmp, config, cpu
        self.incarnation = 0
        self.pid = 0
        self._stack: contextlib.ExitStack | None = None

    def start(self) -> None:
        self.stop()
        self.incarnation += 1
        ready = self.tmp / f"follower-{self.incarnation}.json"
        argv = ["loadtest.simunits", "--from-config", str(self.config), "--nodes", "u0:1"]
        argv += ["--ready-file", str(ready)]
        stack = contextlib.ExitStack()
        info = stack.enter_context(child(argv, ready, self.cpu, "u0 follower"))
        self._stack, self.pid = stack, int(info["pid"])

    def stop(self) -> None:
        """Unreaped until the stack closes, so the pid cannot have been reused by then."""
        stack, self._stack = self._stack, None
        if stack is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)  # a stopped process ignores SIGTERM
        stack.close()


class Watch:
    def __init__(self, metrics: str, pids: list[int]) -> None:
        self.metrics, self.pids = metrics, pids

    def until(self, routable: bool, since: float, within: float) -> Seen:
        want = 1.0 if routable else 0.0
        sent_before = since
        for scrapes in range(1, int(within / POLL_S) + 2):
            ensure_alive(*self.pids)
            sent = time.monotonic()
            state = by_unit(scrape(self.metrics), "unitgate_unit_routable").get("u0")
            got = time.monotonic()
            if state == want:
                return Seen(got - since, max(0.0, sent_before - since), scrapes)
            if got - since > within:
                break
            sent_before = sent
            time.sleep(max(0.0, sent + POLL_S - time.monotonic()))
        what = "routable again" if routable else "not routable"
        raise RuntimeError(f"u0 {what}: not within {within:g} s")


def _units() -> list[dict[str, Any]]:
    units = []
    for i in range(2):
        nodes = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
        units.append({"id": f"u{i}", "leader": nodes[0], "nodes": nodes})
    return units


def run(tmp: Path, pins: Pins | None, trials: int, seed: int) -> Trials:
    sim_cpu = None if pins is None else pins.load
    gw_cpu = None if pins is None else pins.relay
    config = tmp / "detect.toml"
    config.write_text(GATEWAY_TOML + "".join(unit_table(u) for u in _units()))
    with contextlib.ExitStack() as stack:
        pids = []
        for nodes in ("u0:0", "u1:0", "u1:1"):
            ready = tmp / f"sim-{nodes.replace(':', '-')}.json"
            argv = ["loadtest.simunits", "--from-config", str(config), "--nodes", nodes]
            argv += ["--ready-file", str(ready)]
            pids.append(int(stack.enter_context(child(argv, ready, sim_cpu, nodes))["pid"]))
        follower = Follower(tmp, config, sim_cpu)
        stack.callback(follower.stop)
        follower.start()
        ready = tmp / "gw-detect.json"
        argv = ["gateway", "gateway", "--config", str(config), "--log-level", "warning"]
        gw = stack.enter_context(child([*argv, "--ready-file", str(ready)], ready, gw_cpu, "gw"))
        watch = Watch(gw["metrics"], [*pids, int(gw["pid"])])
        return _trials(watch, follower, trials, seed, pins)
    raise AssertionError("unreachable: ExitStack does not swallow exceptions")


class Load:
    """What ran where while the trials ran: a busy machine delays answers and detection."""

    def __init__(self, watch: Watch, follower: Follower, pins: Pins | None) -> None:
        self.watch, self.follower, self.pins = watch, follower, pins
        self.start = self._snap()

    def _snap(self) -> tuple[float, Group, int, dict[str, CoreTicks]]:
        *sims, gw = self.watch.pids
        merged = self.pins is None
        return time.monotonic(), group([*sims, self.follower.pid]), cpu_ticks(gw), cores(merged)

    def report(self) -> tuple[float, dict[str, dict[str, float]]]:
        (t0, g0, gw0, c0), (t1, g1, gw1, c1) = self.start, self._snap()
        sims_s, gw_s, seconds = group_cpu_s(g0, g1), (gw1 - gw0) / CLK_TCK, t1 - t0
        if self.pins is None:
            ours = {"all": (sims_s + gw_s) / seconds}
        else:
            ours = {f"cpu{self.pins.load}": sims_s / seconds}
            ours[f"cpu{self.pins.relay}"] = gw_s / seconds
        return seconds, foreign(c0, c1, ours, seconds)


def _trials(watch: Watch, follower: Follower, n: int, seed: int, pins: Pins | None) -> Trials:
    h = HealthConfig()
    rng = Random(seed)
    out = Trials(seed=seed, settings={k: getattr(h, k) for k in ("interval", "timeout", "fall")})
    out.settings["rise"] = h.rise
    out.first_probed_s = wait_for(
        lambda: count(scrape(watch.metrics), "unitgate_node_healthy", 1.0) == 4,
        BACK_WITHIN_S,
        0.05,
        "all 4 nodes probed healthy",
        lambda: ensure_alive(*watch.pids),
    )

    load = Load(watch, follower, pins)

    def settle() -> None:
        """A random phase against the probe rounds, past the round that readmitted u0."""
        time.sleep(h.interval + rng.uniform(0.0, h.interval))

    for _ in range(n):
        settle()
        fault = time.monotonic()
        os.kill(follower.pid, signal.SIGKILL)
        out.kill.append(watch.until(False, fault, FAULT_WITHIN_S))
        follower.stop()
        restarted = time.monotonic()
        follower.start()
        out.kill_readmitted.append(watch.until(True, restarted, BACK_WITHIN_S))
    for _ in range(n):
        settle()
        fault = time.monotonic()
        os.kill(follower.pid, signal.SIGSTOP)
        try:
            out.freeze.append(watch.until(False, fault, FAULT_WITHIN_S))
        finally:
            fix = time.monotonic()
            os.kill(follower.pid, signal.SIGCONT)
        out.recovery.append(watch.until(True, fix, BACK_WITHIN_S))
    out.seconds, out.cores = load.report()
    samples = scrape(watch.metrics)
    flips = "unitgate_health_transitions_total"
    judged = min(1.0, total(samples, flips, unit="u1", to="healthy"))  # every unit starts unknown
    out.bystander_flips = total(samples, flips, unit="u1") - judged
    out.u0_down_flips = total(samples, flips, unit="u0", to="unhealthy")
    return out
