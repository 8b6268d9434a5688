"""Gateway replicas sharing state through Redis: how fast an admin change is in effect on
every replica, and what the shared state costs a request.

    python -m loadtest.bench.replicas [--replicas 3] [--trials 50] [--requests 3000] [--out DIR]

Propagation: simulated units behind `--replicas` gateway processes sharing a local
redis-server (Debian's, on a Unix socket). Each trial disables or enables unit u0 through one
replica (the writer rotates) and then reads every replica's report in Redis (its heartbeat,
written right after it converges, naming the state version it routes by and the Unix time it
was taken, which is after the routing snapshot was swapped) until all name the new version.
A replica's figure is its report's time minus the time just before the admin request was
sent (one host, one clock), so it bounds "no request routed there any more" from above;
the trial's figure is the slowest replica's. Reported: p50, p99 and max over the trials. The
aim: p99 within 100 ms.

Idle cost: the CPU an idle gateway spends per second (from /proc, over IDLE_S), with the
embedded state and with `redis` (its heartbeat, notification listener and once-a-second
reconcile): the shared state's constant, measured apart from the load's noise.

Cost: the same closed loop (64-token streams from simulated units with no delay, 32 streams)
against one gateway with the embedded state (`sqlite`) and with `redis`, side by side in one
run, the simulator and the load generator pinned to CPU 0 and the gateway to CPU 1. Reported:
the gateway's CPU per request (from /proc) and its ratio. The aim: 1.0x, nothing of the
shared state on the request path (its heartbeat and follower are a constant per second).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import orjson
import redis

from loadtest.bench.machine import machine_facts
from loadtest.bench.processes import (
    CLK_TCK,
    Pins,
    child,
    gateway_toml,
    pin_cpus,
    pinned,
    stop_child,
    tree_ticks,
)
from loadtest.bench.workers import ADMIN, TOKENS, admin_call, measured_load

PREFIX = "bench"
POLL_S = 0.001
TRIAL_WITHIN_S = 5.0
SETTLE_S, IDLE_S = 2.0, 10.0


def state_toml(url: str, replica: str) -> str:
    head = f'[state]\nbackend = "redis"\nurl = "{url}"\nkey_prefix = "{PREFIX}"\n'
    return head + f'replica = "{replica}"\n'


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[redis.Redis]:
    """redis-server on a Unix socket in `folder`, no persistence (a benchmark's state)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    sock = folder / "redis.sock"
    argv = [binary, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"]
    argv += ["--save", "", "--appendonly", "no", "--dir", str(folder), "--loglevel", "warning"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    client = redis.Redis(unix_socket_path=str(sock))
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.exceptions.ConnectionError, FileNotFoundError):
                if client.ping():
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("redis-server did not start")
            time.sleep(0.01)
        yield client
    finally:
        client.close()
        stop_child(proc)


def propagation(tmp: Path, replicas: int, trials: int) -> dict[str, Any]:
    token = secrets.token_urlsafe(32)
    os.environ["UNITGATE_ADMIN_TOKEN"] = token
    sim_ready = tmp / "sim.json"
    sim_argv = ["loadtest.simunits", "--units", "2", "--followers", "1"]
    with (
        redis_server(tmp) as store,
        child([*sim_argv, "--ready-file", str(sim_ready)], sim_ready, None, "simulator") as sim,
        contextlib.ExitStack() as stack,
    ):
        url = f"unix://{tmp / 'redis.sock'}"
        names = [f"r{i}" for i in range(replicas)]
        admins = []
        for name in names:
            config = tmp / f"{name}.toml"
            config.write_text(gateway_toml(sim["units"], admin=ADMIN, state=state_toml(url, name)))
            ready = tmp / f"{name}.json"
            argv = ["gateway", "gateway", "--config", str(config), "--log-level", "warning"]
            argv += ["--ready-file", str(ready)]
            gw = stack.enter_context(child(argv, ready, None, f"gateway {name}", True))
            admins.append(gw["metrics"])
        keys = [f"{PREFIX}:replica:{n}" for n in names]
        samples = []
        for i in range(trials):
            action = "disable" if i % 2 == 0 else "enable"
            sent = time.time()
            admin_call(admins[i % replicas], token, f"/admin/units/u0/{action}")
            version = int(store.get(f"{PREFIX}:version") or 0)
            samples.append(_in_effect(store, keys, version, sent))
    slowest = sorted(max(s) for s in samples)
    return {
        "replicas": replicas,
        "trials": trials,
        "ms_per_trial_slowest_replica": [round(x * 1e3, 3) for x in slowest],
        "p50_ms": round(_at(slowest, 0.5) * 1e3, 2),
        "p99_ms": round(_at(slowest, 0.99) * 1e3, 2),
        "max_ms": round(slowest[-1] * 1e3, 2),
    }


def _in_effect(store: redis.Redis, keys: list[str], version: int, sent: float) -> list[float]:
    """Per replica: seconds from `sent` to its first report naming `version` or later."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + TRIAL_WITHIN_S
    while len(seen) < len(keys):
        if time.monotonic() > deadline:
            raise SystemExit(f"version {version} not reported by {set(keys) - set(seen)}")
        for key, raw in zip(keys, store.mget(keys), strict=True):
            if key not in seen and raw is not None:
                reported, at = orjson.loads(raw)[:2]
                if reported >= version:
                    seen[key] = max(0.0, at - sent)
        time.sleep(POLL_S)
    return list(seen.values())


def idle(tmp: Path, rounds: int) -> list[dict[str, Any]]:
    """CPU per second of an idle gateway, embedded then shared state, `rounds` times in turn."""
    sim_ready = tmp / "sim-idle.json"
    sim_argv = ["loadtest.simunits", "--units", "2", "--followers", "1"]
    url = f"unix://{tmp / 'redis.sock'}"
    runs: list[dict[str, Any]] = []
    with (
        redis_server(tmp),
        child([*sim_argv, "--ready-file", str(sim_ready)], sim_ready, None, "simulator") as sim,
    ):
        for backend in ("sqlite", "redis") * rounds:
            name = f"idle-{backend}-{len(runs)}"
            with _gateway(tmp, name, sim["units"], backend, url, None) as gw:
                time.sleep(SETTLE_S)  # past its start-up work
                before = tree_ticks(int(gw["pid"]))
                time.sleep(IDLE_S)
                ticks = tree_ticks(int(gw["pid"])) - before
            runs.append({"backend": backend, "cpu_ms_per_s": ticks / CLK_TCK / IDLE_S * 1e3})
    return runs


def cost(tmp: Path, requests: int, rounds: int, pins: Pins | None) -> list[dict[str, Any]]:
    """CPU per request of one gateway, embedded state then shared state, same load, `rounds`
    times in turn (so a drift of the machine over the run falls on both)."""
    load_cpu = None if pins is None else pins.load
    relay_cpu = None if pins is None else pins.relay
    sim_ready = tmp / "sim-load.json"
    sim_argv = ["loadtest.simunits", "--units", "2", "--followers", "0", "--ttft-ms", "0"]
    sim_argv += ["--itl-ms", "0", "--tokens", str(TOKENS), "--ready-file", str(sim_ready)]
    url = f"unix://{tmp / 'redis.sock'}"
    runs: list[dict[str, Any]] = []
    with redis_server(tmp), child(sim_argv, sim_ready, load_cpu, "simulator") as sim:
        for backend in ("sqlite", "redis") * rounds:
            name = f"cost-{backend}-{len(runs)}"
            gateway = _gateway(tmp, name, sim["units"], backend, url, relay_cpu)
            with gateway as gw, pinned(load_cpu):
                run = asyncio.run(measured_load(gw["public"], int(gw["pid"]), requests))
            runs.append({"backend": backend, **run})
    return runs


def _gateway(
    tmp: Path, name: str, units: list[dict[str, Any]], backend: str, url: str, cpu: int | None
) -> contextlib.AbstractContextManager[dict[str, Any]]:
    """One benchmark gateway over `units` with the embedded (`sqlite`) or shared state."""
    state = state_toml(url, name) if backend == "redis" else ""
    config = tmp / f"{name}.toml"
    config.write_text(gateway_toml(units, admin=ADMIN, state=state))
    ready = tmp / f"{name}.json"
    argv = ["gateway", "gateway", "--config", str(config), "--log-level", "warning"]
    argv += ["--ready-file", str(ready)]
    return child(argv, ready, cpu, f"gateway ({backend})", True)


def _mean(runs: list[dict[str, Any]], backend: str, field: str) -> float:
    values = [float(r[field]) for r in runs if r["backend"] == backend]
    return sum(values) / len(values)


def _at(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.replicas", description=__doc__)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--requests", type=int, default=3000, help="per cost run (0: none)")
    p.add_argument("--rounds", type=int, default=2, help="cost runs of each backend, in turn")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.replicas < 1 or args.trials < 1 or args.requests < 0:
        p.error("--replicas and --trials must be >= 1, --requests >= 0")
    with TemporaryDirectory(prefix="ug-rep-") as tmp:  # short: a Unix socket path is bounded
        folder = Path(tmp)
        (folder / "prop").mkdir()
        prop = propagation(folder / "prop", args.replicas, args.trials)
        (folder / "idle").mkdir()
        idles = idle(folder / "idle", max(1, args.rounds))
        runs = []
        if args.requests:
            (folder / "cost").mkdir()
            runs = cost(folder / "cost", args.requests, max(1, args.rounds), pin_cpus())
    print("| replicas | trials | in effect on every replica: p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|")
    print(
        f"| {prop['replicas']} | {prop['trials']} | {prop['p50_ms']:.2f} | {prop['p99_ms']:.2f} "
        f"| {prop['max_ms']:.2f} |"
    )
    idle_mean = {b: _mean(idles, b, "cpu_ms_per_s") for b in ("sqlite", "redis")}
    print(
        f"\nidle gateway CPU: sqlite {idle_mean['sqlite']:.1f} ms/s, "
        f"redis {idle_mean['redis']:.1f} ms/s (means of {len(idles) // 2})"
    )
    if runs:
        mean = {b: _mean(runs, b, "cpu_us_per_request") for b in ("sqlite", "redis")}
        print("\n| state | completed | failed | requests/s | gateway CPU us/request |")
        print("|---|---|---|---|---|")
        for r in runs:
            print(
                f"| {r['backend']} | {r['completed']} | {r['failed']} | {r['rps']:.0f} "
                f"| {r['cpu_us_per_request']:.0f} |"
            )
        print(f"\nredis/sqlite CPU per request (means): {mean['redis'] / mean['sqlite']:.2f}x")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        data = {"machine": machine_facts(), "propagation": prop, "idle": idles, "cost": runs}
        (args.out / "replicas.json").write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
