"""Prober scale: one simulator with 1,000 units of 4 nodes, a probing and an idle gateway.

Both gateways run through the same window on the same CPU: the idle one (health disabled)
is the baseline of a gateway that only holds 1,000 units, so the difference is the probers.

Observing disturbs: rendering a 1,000-unit /metrics blocks the gateway's loop for longer than
a probe's timeout (~0.4 s measured), which times out the probes in flight and bunches the
rounds due meanwhile, and one scrape has ejected most units for ~10 s. So nothing scrapes the
probing gateway before or during the window: readiness is read from /proc (probes flowing
both ways at the full rate), flips from the gateway's log (flips.py), and the one scrape
after the window checks that every node was probed and is healthy. What one scrape does is
then measured on its own, after the window.

This part reaches inside the gateway on purpose, past gateway.api: what it measures is the
prober, and the probe rate is derived from the bytes the gateway wrote divided by the length
of one probe's request head, so it builds that head with the prober's own
gateway.health.probe.Target rather than a copy that could drift.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gateway.health.probe import Target
from loadtest.bench.health import flips
from loadtest.bench.health.flips import logged_child
from loadtest.bench.health.observe import (
    CoreTicks,
    Sample,
    by_unit,
    cores,
    count,
    counters,
    ensure_alive,
    foreign,
    scrape,
    total,
)
from loadtest.bench.processes import CLK_TCK, Pins, child, cpu_ticks

INTERVAL_S = 1.0
READY_WITHIN_S = 60.0  # 4,000 first connections on a shared core
STEADY_SHARE = 0.95  # of the expected probe rate, both written by the gateway and read
# Past the first rounds' connects: what is measured is keep-alive steady state.
SETTLE_S = 3 * INTERVAL_S
SCRAPE_EFFECT_S = 15.0  # ejections after one scrape were seen to heal within ~12 s
GATEWAY_TOML = """\
[gateway]
port = 0
[metrics]
port = 0
[health]
enabled = {enabled}
interval = {interval}
[breaker]
[admin]
enabled = false
"""


@dataclass(frozen=True)
class Scale:
    units: int
    nodes: int
    interval_s: float
    window_s: float
    settle_s: float
    ready_after_s: float  # gateway start to all units healthy, probes at the full rate
    ready: bool  # False: the deadline passed and the window was measured anyway
    gateway_cpu_s: float
    idle_cpu_s: float
    sim_cpu_s: float
    head_bytes: float  # mean probe request head, to turn written bytes into probes
    gateway_wchar: int
    sim_rchar: int
    sim_wchar: int
    # From the gateway's log (flips.py): no scrape disturbed these. Start-up: from the gateway's
    # start until every unit was healthy with probes at the full rate (its first connects);
    # settling: from then until the window.
    flips_start_up: int
    flips_settling: int
    flips_window: int
    start_up_cores: list[dict[str, float]]  # per second of start-up: process -> cores
    # From the scrape after the window: counters since the gateway started.
    flips_since_start: float
    failures_since_start: float
    nodes_healthy: int
    units_unhealthy: int
    # One scrape, and what followed it in the next SCRAPE_EFFECT_S.
    scrape_s: float
    scrape_flips: float
    scrape_failures: float
    scrape_units_unhealthy: int  # at the second scrape, SCRAPE_EFFECT_S after the first
    affinity: dict[str, list[int]]
    cores: dict[str, dict[str, float]]  # per CPU, in cores: task, irq, steal, ours, other
    flip_timeline: dict[str, int]  # flips per second, from the window's start
    other_load_timeline: list[dict[str, float]]  # per second of the window: cpu -> cores
    flip_reasons: dict[str, int]  # of the flips after start-up
    start_up_reasons: dict[str, int]

    @property
    def expected_probes_per_s(self) -> float:
        return self.nodes / self.interval_s

    @property
    def probes(self) -> float:
        return self.gateway_wchar / self.head_bytes

    @property
    def probes_per_s(self) -> float:
        return self.probes / self.window_s

    @property
    def sim_probes_per_s(self) -> float:
        """The other end's count of the same heads: a check on the gateway-side figure."""
        return self.sim_rchar / self.head_bytes / self.window_s

    def derived(self) -> dict[str, float]:
        probes = self.probes or float("nan")
        net = self.gateway_cpu_s - self.idle_cpu_s
        return {
            "gateway_cores": self.gateway_cpu_s / self.window_s,
            "idle_cores": self.idle_cpu_s / self.window_s,
            "prober_cores": net / self.window_s,
            "sim_cores": self.sim_cpu_s / self.window_s,
            "expected_probes_per_s": self.expected_probes_per_s,
            "probes_per_s": self.probes_per_s,
            "sim_probes_per_s": self.sim_probes_per_s,
            "gateway_cpu_us_per_probe": self.gateway_cpu_s / probes * 1e6,
            "prober_cpu_us_per_probe": net / probes * 1e6,
            "sim_cpu_us_per_probe": self.sim_cpu_s / probes * 1e6,
            "sim_answer_bytes": self.sim_wchar / probes,
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | self.derived()


def gateway_toml(units: list[dict[str, Any]], enabled: bool) -> str:
    head = GATEWAY_TOML.format(enabled=str(enabled).lower(), interval=INTERVAL_S)
    return head + "".join(unit_table(u) for u in units)


def unit_table(unit: dict[str, Any]) -> str:
    nodes = ", ".join(f'"{url}"' for url in unit["nodes"])
    return f'[[units]]\nid = "{unit["id"]}"\nleader = "{unit["leader"]}"\nnodes = [{nodes}]\n'


def run(tmp: Path, pins: Pins | None, units: int, followers: int, window: float) -> Scale:
    sim_cpu = None if pins is None else pins.load
    gw_cpu = None if pins is None else pins.relay
    sim_argv = ["loadtest.simunits", "--units", str(units), "--followers", str(followers)]
    sim_argv += ["--ready-file", str(tmp / "sim.json")]
    with contextlib.ExitStack() as stack:
        sim = stack.enter_context(child(sim_argv, tmp / "sim.json", sim_cpu, "simulator"))
        gws: dict[str, dict[str, Any]] = {}
        for name, enabled in (("idle", False), ("probing", True)):
            toml = tmp / f"gw-{name}.toml"
            toml.write_text(gateway_toml(sim["units"], enabled))
            ready = tmp / f"gw-{name}.json"
            argv = ["gateway", "gateway", "--config", str(toml), "--ready-file", str(ready)]
            # info: flip events are logged (steady state logs nothing); see flips.py
            level = ["--log-level", "info" if enabled else "warning"]
            log = tmp / f"gw-{name}.log"
            gateway = logged_child([*argv, *level], ready, gw_cpu, f"{name} gateway", log)
            gws[name] = stack.enter_context(gateway)
        pids = {"sim": int(sim["pid"]), **{k: int(v["pid"]) for k, v in gws.items()}}
        pids["harness"] = os.getpid()
        metrics = gws["probing"]["metrics"]
        return _measure(sim["units"], pids, metrics, tmp / "gw-probing.log", window, pins)
    raise AssertionError("unreachable: ExitStack does not swallow exceptions")


@dataclass(frozen=True)
class StartUp:
    after_s: float  # from the wait's start to readiness (or to giving up)
    ready: bool
    at: float  # wall clock (time.time()) when it ended
    cores: list[dict[str, float]]  # per second waited: "sim" and "probing" -> cores


def _wait_ready(
    pids: dict[str, int],
    expected: float,
    head: float,
    log: Path,
    alive: Callable[[], None],
    units: int,
) -> StartUp:
    """Every unit healthy (by the log) and probes written and read at the full rate (by /proc)
    for two seconds running: readiness without a scrape that would stall the gateway.
    Not ready by the deadline is returned, not raised: the window's numbers still tell why."""
    started = time.monotonic()
    steady, last, before = 0, started, (counters(pids["probing"]), counters(pids["sim"]))
    logged = log.stat().st_size
    seconds: list[dict[str, float]] = []
    for _ in range(int(READY_WITHIN_S) + 1):
        time.sleep(1.0)
        alive()
        now, after = time.monotonic(), (counters(pids["probing"]), counters(pids["sim"]))
        size = log.stat().st_size
        grown, logged = size - logged, size
        waited = now - last
        written = (after[0].wchar - before[0].wchar - grown) / head / waited
        read = (after[1].rchar - before[1].rchar) / head / waited
        seconds.append(
            {
                "sim": round(before[1].cpu_s(after[1]) / waited, 2),
                "probing": round(before[0].cpu_s(after[0]) / waited, 2),
            }
        )
        flowing = min(written, read) >= STEADY_SHARE * expected
        all_in = len(flips.routable(flips.read(log))) == units
        steady = steady + 1 if flowing and all_in else 0
        if steady >= 2:
            return StartUp(now - started, True, time.time(), seconds)
        if now - started > READY_WITHIN_S:
            break
        last, before = now, after
    return StartUp(time.monotonic() - started, False, time.time(), seconds)


def _unhealthy(samples: list[Sample]) -> int:
    return sum(1 for v in by_unit(samples, "unitgate_unit_healthy").values() if not v)


def _ours(pins: Pins | None, cpu_s: dict[str, float], seconds: float) -> dict[str, float]:
    if pins is None:
        return {"all": sum(cpu_s.values()) / seconds}
    load = cpu_s["sim"] + cpu_s["harness"]
    relay = cpu_s["probing"] + cpu_s["idle"]
    return {f"cpu{pins.load}": load / seconds, f"cpu{pins.relay}": relay / seconds}


def _watch_load(end: float, pids: dict[str, int], pins: Pins | None) -> list[dict[str, float]]:
    """Others' load per core, second by second: a flip needs a stall of a few hundred ms, and
    on a shared machine anyone's burst can cause one; this says whether one did."""

    def snap() -> tuple[float, dict[str, int], dict[str, CoreTicks]]:
        return time.monotonic(), {k: cpu_ticks(p) for k, p in pids.items()}, cores(pins is None)

    seconds: list[dict[str, float]] = []
    then, ticks, busy = snap()
    for _ in range(int(end - then) + 2):
        if then >= end:
            break
        time.sleep(min(1.0, end - then))
        now, ticks_now, busy_now = snap()
        cpu_s = {k: (ticks_now[k] - ticks[k]) / CLK_TCK for k in pids}
        load = foreign(busy, busy_now, _ours(pins, cpu_s, now - then), now - then)
        seconds.append({cpu: round(c["other"], 2) for cpu, c in load.items()})
        then, ticks, busy = now, ticks_now, busy_now
    return seconds


def _measure(
    units: list[dict[str, Any]],
    pids: dict[str, int],
    metrics: str,
    log: Path,
    window: float,
    pins: Pins | None,
) -> Scale:
    nodes = sum(len(u["nodes"]) for u in units)
    heads = [len(Target(url).head) for u in units for url in u["nodes"]]
    head = sum(heads) / len(heads)
    alive = functools.partial(ensure_alive, *pids.values())
    start_up = _wait_ready(pids, nodes / INTERVAL_S, head, log, alive, len(units))
    time.sleep(SETTLE_S)
    before = {k: counters(pid) for k, pid in pids.items()}
    cores_before, logged = cores(merge=pins is None), log.stat().st_size
    start, wall = time.monotonic(), time.time()
    other = _watch_load(start + window, pids, pins)
    after = {k: counters(pid) for k, pid in pids.items()}
    cores_after, logged = cores(merge=pins is None), log.stat().st_size - logged
    elapsed, wall_end = time.monotonic() - start, time.time()
    started = time.monotonic()
    last = scrape(metrics)
    scrape_s = time.monotonic() - started
    time.sleep(SCRAPE_EFFECT_S)
    effect = scrape(metrics)
    alive()
    seen = flips.read(log)
    cpu_s = {k: before[k].cpu_s(after[k]) for k in pids}
    counted, failures = "unitgate_health_transitions_total", "unitgate_probe_failures_total"
    return Scale(
        units=len(units),
        nodes=nodes,
        interval_s=INTERVAL_S,
        window_s=elapsed,
        settle_s=SETTLE_S,
        ready_after_s=start_up.after_s,
        ready=start_up.ready,
        gateway_cpu_s=cpu_s["probing"],
        idle_cpu_s=cpu_s["idle"],
        sim_cpu_s=cpu_s["sim"],
        head_bytes=head,
        # Its log lines went through write() too: only a flapping gateway writes any.
        gateway_wchar=after["probing"].wchar - before["probing"].wchar - logged,
        sim_rchar=after["sim"].rchar - before["sim"].rchar,
        sim_wchar=after["sim"].wchar - before["sim"].wchar,
        flips_start_up=flips.between(seen, 0.0, start_up.at),
        flips_settling=flips.between(seen, start_up.at, wall),
        flips_window=flips.between(seen, wall, wall_end),
        start_up_cores=start_up.cores,
        flips_since_start=total(last, counted),
        failures_since_start=total(last, failures),
        nodes_healthy=count(last, "unitgate_node_healthy", 1.0),
        units_unhealthy=_unhealthy(last),
        scrape_s=scrape_s,
        scrape_flips=total(effect, counted) - total(last, counted),
        scrape_failures=total(effect, failures) - total(last, failures),
        scrape_units_unhealthy=_unhealthy(effect),
        affinity={k: sorted(os.sched_getaffinity(pid)) for k, pid in pids.items()},
        cores=foreign(cores_before, cores_after, _ours(pins, cpu_s, elapsed), elapsed),
        flip_timeline=flips.timeline(seen, wall),
        other_load_timeline=other,
        flip_reasons=flips.reasons([f for f in seen if f.at >= start_up.at]),
        start_up_reasons=flips.reasons([f for f in seen if f.at < start_up.at]),
    )
