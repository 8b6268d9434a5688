"""How fast a control-plane change reaches every worker (`[gateway].workers`).

    python -m loadtest.bench.workers [--workers 2 4] [--changes 200] [--out DIR]

Simulated units behind a gateway of N workers; an admin client disables and enables a unit
`--changes` times (each one state broadcast), then reads `/admin/workers`: per worker, the
time from the control plane sending a state version to that worker acknowledging it applied
it (a worker acknowledges after applying, so this bounds "in effect" from above). Reported:
p50, p99 and max over every worker's samples. The aim (issue 15): p99 within 50 ms.
"""

from __future__ import annotations

import argparse
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
from loadtest.bench.processes import child, gateway_toml

ADMIN = '[admin]\nenabled = true\nstate_file = ""\nallow_unauthenticated_loopback = false\n'


def _admin(url: str, token: str, path: str, method: str = "POST") -> Any:
    data = b'{"reason": "benchmark"}' if method == "POST" else None
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def measure(tmp: Path, workers: int, changes: int) -> dict[str, Any]:
    token = secrets.token_urlsafe(16)
    os.environ["UNITGATE_ADMIN_TOKEN"] = token
    sim_argv = ["loadtest.simunits", "--units", "2", "--followers", "1"]
    sim_ready = tmp / f"sim-{workers}.json"
    sim_argv += ["--ready-file", str(sim_ready)]
    with child(sim_argv, sim_ready, None, "simulator") as sim:
        toml = gateway_toml(sim["units"], admin=ADMIN)
        config = tmp / f"gw-{workers}.toml"
        config.write_text(toml.replace("[gateway]\n", f"[gateway]\nworkers = {workers}\n", 1))
        ready = tmp / f"gw-{workers}.json"
        argv = ["gateway", "gateway", "--config", str(config), "--log-level", "warning"]
        with child([*argv, "--ready-file", str(ready)], ready, None, "gateway", True) as gw:
            ops = gw["metrics"]
            for i in range(changes):
                action = "disable" if i % 2 == 0 else "enable"
                _admin(ops, token, f"/admin/units/u0/{action}")
                time.sleep(0.01)
            deadline = time.monotonic() + 10
            while True:  # every worker has acknowledged the last change
                views = _admin(ops, token, "/admin/workers", "GET")["workers"]
                if min(w["applied"] for w in views) >= changes or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
    return {"workers": workers, "changes": changes, "per_worker": views}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.workers", description=__doc__)
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--changes", type=int, default=200)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    results = []
    with TemporaryDirectory(prefix="unitgate-workers-") as tmp:
        for n in args.workers:
            results.append(measure(Path(tmp), n, args.changes))
    print("| workers | changes | propagation p50 ms | p99 ms | max ms (worst worker) |")
    print("|---|---|---|---|---|")
    for r in results:
        props = [w["propagation_ms"] for w in r["per_worker"] if w["propagation_ms"]]
        worst = max(props, key=lambda p: p["p99"])
        print(
            f"| {r['workers']} | {r['changes']} | {worst['p50']:.2f} | {worst['p99']:.2f} "
            f"| {max(p['max'] for p in props):.2f} |"
        )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        data = {"machine": machine_facts(), "results": results}
        (args.out / "workers.json").write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
