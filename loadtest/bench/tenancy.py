"""What tenancy costs a request: API keys, per-key limits and priority classes on, against off.

    python -m loadtest.bench.tenancy [--requests 3000] [--rounds 2] [--out DIR]

The same closed loop (64-token streams from simulated units with no delay, 32 streams)
against one gateway with tenancy off (no `[auth]`, no `[priority]`, no limits) and one with
it on: `[auth] required = true` and every request carrying a key with rpm, tpm and
max_inflight limits far above the load (so every request is admitted, and charged), and
`[priority]` with the request asking for `interactive` (clamped to the key's `standard`).
Both gateways share their state through a local redis-server (keys and limits live there), so
the store work per request is in the figure too. The simulator and the load generator are
pinned to CPU 0 and the gateway to CPU 1; the runs alternate (`--rounds` of each) so a drift
of the machine falls on both.

Reported: the gateway's CPU per request (from /proc) and the ratio on/off (the aim: 1.05x),
and Redis commands per request (INFO commandstats before and after each run, minus what an
idle gateway sends over the same time: its heartbeat and reconcile).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import redis

from loadtest.bench.machine import machine_facts
from loadtest.bench.processes import Pins, child, gateway_toml, pin_cpus, pinned
from loadtest.bench.replicas import redis_server, state_toml
from loadtest.bench.workers import ADMIN, TOKENS, admin_call, measured_load

MODES = ("off", "on")
TENANCY = "[auth]\nrequired = true\n[priority]\n"
LIMITS = {"rpm": 10_000_000, "tpm": 10_000_000_000, "max_inflight": 10_000}
KEY = {"tenant": "bench", "priority": "standard", **LIMITS}


def commands(store: redis.Redis) -> int:
    """Commands Redis has run since it started (INFO commandstats summed)."""
    stats = store.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


@contextlib.contextmanager
def gateway(
    tmp: Path, name: str, units: list[dict[str, Any]], mode: str, url: str, cpu: int | None
) -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
    """One gateway, tenancy `mode`; its ready file and the headers its requests carry."""
    config = tmp / f"{name}.toml"
    extra = TENANCY if mode == "on" else ""
    config.write_text(gateway_toml(units, admin=ADMIN, state=state_toml(url, name)) + extra)
    ready = tmp / f"{name}.json"
    argv = ["gateway", "gateway", "--config", str(config), "--log-level", "warning"]
    argv += ["--ready-file", str(ready)]
    token = secrets.token_urlsafe(32)
    os.environ["UNITGATE_ADMIN_TOKEN"] = token  # the child's admin token
    with child(argv, ready, cpu, f"gateway (tenancy {mode})", True) as gw:
        headers: dict[str, str] = {}
        if mode == "on":
            key = admin_call(str(gw["metrics"]), token, "/admin/keys", body=KEY)["key"]
            headers = {"Authorization": f"Bearer {key}", "x-unitgate-priority": "interactive"}
        yield gw, headers


def cost(tmp: Path, requests: int, rounds: int, pins: Pins | None) -> list[dict[str, Any]]:
    load_cpu = None if pins is None else pins.load
    relay_cpu = None if pins is None else pins.relay
    sim_ready = tmp / "sim.json"
    sim_argv = ["loadtest.simunits", "--units", "2", "--followers", "0", "--ttft-ms", "0"]
    sim_argv += ["--itl-ms", "0", "--tokens", str(TOKENS), "--ready-file", str(sim_ready)]
    url = f"unix://{tmp / 'redis.sock'}"
    runs: list[dict[str, Any]] = []
    with redis_server(tmp) as store, child(sim_argv, sim_ready, load_cpu, "simulator") as sim:
        for mode in MODES * rounds:
            name = f"{mode}-{len(runs)}"
            with gateway(tmp, name, sim["units"], mode, url, relay_cpu) as (gw, headers):
                idle0, t0 = commands(store), time.monotonic()
                time.sleep(2.0)  # what the gateway sends Redis with no request
                idle_rate = (commands(store) - idle0) / (time.monotonic() - t0)
                before, t1 = commands(store), time.monotonic()
                with pinned(load_cpu):
                    run = asyncio.run(
                        measured_load(gw["public"], int(gw["pid"]), requests, headers)
                    )
                sent = commands(store) - before - idle_rate * (time.monotonic() - t1)
            per_request = max(0.0, sent) / max(1, run["completed"])
            runs.append({"mode": mode, **run, "redis_commands_per_request": per_request})
    return runs


def _mean(runs: list[dict[str, Any]], mode: str, field: str) -> float:
    values = [float(r[field]) for r in runs if r["mode"] == mode]
    return sum(values) / len(values)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.tenancy", description=__doc__)
    p.add_argument("--requests", type=int, default=3000, help="per run")
    p.add_argument("--rounds", type=int, default=2, help="runs of each mode, in turn")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.requests < 1 or args.rounds < 1:
        p.error("--requests and --rounds must be >= 1")
    with TemporaryDirectory(prefix="ug-ten-") as tmp:  # short: a Unix socket path is bounded
        runs = cost(Path(tmp), args.requests, args.rounds, pin_cpus())
    print(
        "| tenancy | completed | failed | requests/s | gateway CPU us/request"
        " | Redis cmds/request |"
    )
    print("|---|---|---|---|---|---|")
    for r in runs:
        print(
            f"| {r['mode']} | {r['completed']} | {r['failed']} | {r['rps']:.0f} "
            f"| {r['cpu_us_per_request']:.0f} | {r['redis_commands_per_request']:.2f} |"
        )
    mean = {m: _mean(runs, m, "cpu_us_per_request") for m in MODES}
    print(f"\non/off CPU per request (means): {mean['on'] / mean['off']:.3f}x")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        data = {"machine": machine_facts(), "cost": runs}
        (args.out / "tenancy.json").write_text(json.dumps(data, indent=2))
    return 1 if any(r["failed"] for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
