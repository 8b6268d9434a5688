"""The gateway with `[gateway].workers`: how fast a control-plane change reaches every worker,
and what workers cost and carry.

    python -m loadtest.bench.workers [--workers 2 4] [--changes 200] [--requests 3000] [--out DIR]

Propagation: simulated units behind a gateway of N workers; an admin client disables and
enables a unit `--changes` times (each one state broadcast), then reads `/admin/workers`: per
worker, the time from the control plane sending a state version to that worker acknowledging
it applied it (a worker acknowledges after applying, so this bounds "in effect" from above).
Reported: p50, p99 and max over every worker's samples. The aim: p99 within 50 ms.

Cost and capacity, for workers = 1 and 2 (64-token streams from simulated units with no
delay, a closed loop of 32 streams, one run each after a warm-up):
- pinned: the simulator and the load generator on CPU 0, the whole gateway (control plane and
  workers) on CPU 1; reported: the gateway's CPU per request (every process of it, from
  /proc). The aim: within 1.1x of one worker's.
- unpinned: everything shares both CPUs; reported: requests/s at saturation. On 2 cores the
  load generator and the simulator take what the second worker would use, so this shows
  what the machine allows, not what N workers carry on a host of their own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import time
import urllib.request
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from loadtest.bench.machine import machine_facts
from loadtest.bench.overhead.load import closed_loop
from loadtest.bench.processes import (
    CLK_TCK,
    Pins,
    child,
    gateway_toml,
    pin_cpus,
    pinned,
    tree_ticks,
)
from loadtest.gen.client import open_session

TOKENS = 64  # per answer, as in the overhead benchmark
CONCURRENCY = 32
ADMIN = '[admin]\nenabled = true\nstate_file = ""\nallow_unauthenticated_loopback = false\n'


def admin_call(
    url: str, token: str, path: str, method: str = "POST", body: dict[str, Any] | None = None
) -> Any:
    """One admin API request with the benchmark's token; its JSON answer (also used by
    bench.replicas and bench.tenancy)."""
    data = None if method != "POST" else json.dumps(body or {"reason": "benchmark"}).encode()
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def measure(tmp: Path, workers: int, changes: int) -> dict[str, Any]:
    token = secrets.token_urlsafe(32)
    os.environ["UNITGATE_ADMIN_TOKEN"] = token
    sim_argv = ["loadtest.simunits", "--units", "2", "--followers", "1"]
    sim_ready = tmp / f"sim-{workers}.json"
    sim_argv += ["--ready-file", str(sim_ready)]
    with child(sim_argv, sim_ready, None, "simulator") as sim:
        config = tmp / f"gw-{workers}.toml"
        config.write_text(gateway_toml(sim["units"], admin=ADMIN, workers=workers))
        ready = tmp / f"gw-{workers}.json"
        argv = ["gateway", "gateway", "--config", str(config), "--log-level", "warning"]
        with child([*argv, "--ready-file", str(ready)], ready, None, "gateway", True) as gw:
            ops = gw["metrics"]
            for i in range(changes):
                action = "disable" if i % 2 == 0 else "enable"
                admin_call(ops, token, f"/admin/units/u0/{action}")
                time.sleep(0.01)
            deadline = time.monotonic() + 10
            while True:  # every worker has acknowledged the last change
                views = admin_call(ops, token, "/admin/workers", "GET")["workers"]
                if min(w["applied"] for w in views) >= changes or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
    return {"workers": workers, "changes": changes, "per_worker": views}


def capacity(tmp: Path, workers: int, requests: int, pins: Pins | None) -> dict[str, Any]:
    """One closed-loop run against a gateway of `workers` (pinned as the docstring says, or
    not at all when `pins` is None)."""
    sim_ready = tmp / f"sim-load-{workers}-{pins is not None}.json"
    sim_argv = ["loadtest.simunits", "--units", "2", "--followers", "0", "--ttft-ms", "0"]
    sim_argv += ["--itl-ms", "0", "--tokens", str(TOKENS), "--ready-file", str(sim_ready)]
    load_cpu = None if pins is None else pins.load
    relay_cpu = None if pins is None else pins.relay
    with child(sim_argv, sim_ready, load_cpu, "simulator") as sim:
        config = tmp / f"gw-load-{workers}.toml"
        config.write_text(gateway_toml(sim["units"], workers=workers))
        ready = tmp / f"gw-load-{workers}-{pins is not None}.json"
        argv = ["gateway", "gateway", "--config", str(config), "--log-level", "warning"]
        argv += ["--ready-file", str(ready)]
        with child(argv, ready, relay_cpu, "gateway", True) as gw, pinned(load_cpu):
            return asyncio.run(measured_load(gw["public"], int(gw["pid"]), requests))


async def measured_load(
    url: str, pid: int, requests: int, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """A warmed-up closed loop of CONCURRENCY and the CPU the gateway tree spent on it (also
    used by bench.replicas and bench.tenancy); `headers` go with every request."""
    async with open_session(CONCURRENCY) as session:
        session.headers.update(headers or {})
        await closed_loop(session, [url], 2 * CONCURRENCY, CONCURRENCY, 0.0)
        cpu0 = tree_ticks(pid)
        loop = await closed_loop(session, [url], requests, CONCURRENCY, 0.0)
        cpu = tree_ticks(pid) - cpu0
    ok = sum(1 for r in loop.records if r.ok)
    return {
        "completed": ok,
        "failed": len(loop.records) - ok + loop.unsent,
        "rps": ok / loop.wall_s,
        "cpu_us_per_request": cpu / CLK_TCK * 1e6 / max(ok, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.workers", description=__doc__)
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--changes", type=int, default=200)
    p.add_argument("--requests", type=int, default=3000, help="per capacity run (0: none)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    results, loads = [], []
    with TemporaryDirectory(prefix="unitgate-workers-") as tmp:
        for n in args.workers:
            results.append(measure(Path(tmp), n, args.changes))
        pins = pin_cpus()
        if args.requests:
            for placed in (pins, None) if pins is not None else (None,):
                for n in (1, 2):
                    run = capacity(Path(tmp), n, args.requests, placed)
                    loads.append({"workers": n, "pinned": placed is not None, **run})
    print("| workers | changes | propagation p50 ms | p99 ms | max ms (worst worker) |")
    print("|---|---|---|---|---|")
    for r in results:
        props = [w["propagation_ms"] for w in r["per_worker"] if w["propagation_ms"]]
        worst = max(props, key=lambda p: p["p99"])
        print(
            f"| {r['workers']} | {r['changes']} | {worst['p50']:.2f} | {worst['p99']:.2f} "
            f"| {max(p['max'] for p in props):.2f} |"
        )
    if loads:
        print("\n| workers | pinned | completed | failed | requests/s | gateway CPU us/request |")
        print("|---|---|---|---|---|---|")
        for r in loads:
            print(
                f"| {r['workers']} | {'yes' if r['pinned'] else 'no'} | {r['completed']} "
                f"| {r['failed']} | {r['rps']:.0f} | {r['cpu_us_per_request']:.0f} |"
            )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        data = {"machine": machine_facts(), "results": results, "capacity": loads}
        (args.out / "workers.json").write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
