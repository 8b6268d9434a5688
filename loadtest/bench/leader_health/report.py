"""Per endpoint and phase: latency percentiles, the share a 0.2 s probe timeout would fail,
and what the leader itself said about its load; printed as a table and written as JSON."""

from __future__ import annotations

import os
from pathlib import Path
from statistics import median
from typing import Any

import orjson

from loadtest.bench.leader_health.probe import DEADLINE_S, Probe
from loadtest.bench.leader_health.unit import Pins
from loadtest.bench.machine import machine_facts
from loadtest.gen.stats import percentile

PROBE_TIMEOUT_S = 0.2  # the gateway's default [health].timeout
ENDPOINTS = {"api": "API port (event loop)", "thread": "health port (thread)"}


def summarize(probes: list[Probe]) -> dict[str, Any]:
    """Milliseconds. A probe without an answer counts at the deadline in the percentiles (a
    lower bound of its latency) and as failed; `over_200ms` is the share the gateway's
    prober would have counted as failed probes."""
    answered = sorted(p.latency_s for p in probes if p.latency_s is not None)
    counted = sorted([*answered, *(DEADLINE_S for p in probes if p.latency_s is None)])
    failed = sum(1 for p in probes if p.latency_s is None or p.latency_s > PROBE_TIMEOUT_S)
    out: dict[str, Any] = {
        "probes": len(probes),
        "timeouts": sum(1 for p in probes if p.outcome == "timeout"),
        "errors": sum(1 for p in probes if p.outcome not in ("ok", "timeout")),
        "over_200ms": failed / len(probes) if probes else None,
    }
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100)):
        out[f"{name}_ms"] = percentile(counted, q) * 1000 if counted else None
    return out


def load_evidence(probes: list[Probe], window_s: float) -> dict[str, Any]:
    """The leader's own pending count and step rate, from its answers: saturated means more
    requests pending than it has KV slots, while its steps keep advancing."""
    pending = [p.pending for p in probes if p.pending is not None]
    steps = [p.step for p in probes if p.step is not None]
    return {
        "pending_median": median(pending) if pending else None,
        "pending_max": max(pending, default=None),
        "steps_per_s": (steps[-1] - steps[0]) / window_s if len(steps) > 1 else None,
    }


def describe_load(load: dict[str, Any], slots: int) -> str:
    rate = load["steps_per_s"]
    steps = "?" if rate is None else f"{rate:.1f}"
    return (
        f"leader under load: pending median {load['pending_median']}, max"
        f" {load['pending_max']} ({slots} KV slots), {steps} steps/s"
    )


def table(phases: dict[str, dict[str, dict[str, Any]]]) -> str:
    head = (
        f"{'phase':<10} {'endpoint':<22} {'probes':>6} {'p50 ms':>8} {'p90 ms':>8}"
        f" {'p99 ms':>8} {'max ms':>8} {'>200 ms':>8} {'timeouts':>8}"
    )
    lines = [head, "-" * len(head)]
    for phase, by_endpoint in phases.items():
        for key, label in ENDPOINTS.items():
            s = by_endpoint[key]
            share = "-" if s["over_200ms"] is None else f"{s['over_200ms']:.1%}"
            lines.append(
                f"{phase:<10} {label:<22} {s['probes']:>6} {_ms(s['p50_ms'])} {_ms(s['p90_ms'])}"
                f" {_ms(s['p99_ms'])} {_ms(s['max_ms'])} {share:>8} {s['timeouts']:>8}"
            )
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return f"{'-':>8}" if value is None else f"{value:>8.1f}"


def placement(cpus: Pins | None) -> dict[str, Any]:
    if cpus is None:
        return {"pinned": False}
    return {"pinned": True, "leader_cpu": cpus.leader, "others_cpu": cpus.rest}


def machine() -> dict[str, Any]:
    return machine_facts() | {"affinity_available": sorted(os.sched_getaffinity(0))}


def write_json(out: Path, report: dict[str, Any]) -> Path:
    report["machine"]["loadavg_at_end"] = os.getloadavg()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "leader_health.json"
    path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return path
