"""`python -m loadtest.bench.rollout_cost`: what a running rollout adds to the gateway's CPU
per request.

Two gateways of this tree over the same four simulated units (cells a and b, each a unit of
revision v1 and one of v2), each pinned to the relay's core: one with no rollout, the other in
the middle of one (cell a at 50%, its step held for a day). Rounds alternate as in
`loadtest.bench.ab`, each reading the gateway's CPU per request from /proc:

    python -m loadtest.bench.rollout_cost --itl 0 --concurrency 32 --requests 2000

The rolling gateway does the rollout's per-request work: each request's draw, the split
snapshot, and the collector counting every answer of both revisions into the step's and the
cell's windows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from loadtest.bench.ab import report, rounds
from loadtest.bench.overhead.params import TOKENS
from loadtest.bench.processes import MODEL, child, gateway_toml, pin_cpus, pinned
from loadtest.bench.rollout_client import at_step, start

SIDES = ("still", "rolling")
LABELS = ("no rollout", "rollout at 50% of a cell")
CELLS = {"u0": ("a", "v1"), "u1": ("a", "v2"), "u2": ("b", "v1"), "u3": ("b", "v2")}
ADMIN = '[admin]\nenabled = true\nstate_file = ""\n'
ASK = {"to": "v2", "from": "v1", "steps": [50, 100], "step_seconds": 86400.0}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.rollout_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--itl", type=float, default=0.0, help="ms between tokens")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--requests", type=int, default=2000, help="per round and side")
    p.add_argument("--rounds", type=int, default=5, help="measured rounds per side")
    args = p.parse_args(argv)
    for name in ("concurrency", "requests", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.itl < 0:
        p.error("--itl must not be negative")
    return args


def config(units: list[dict[str, Any]]) -> str:
    """The benchmark gateway's config, its units in two cells of two revisions."""
    head = gateway_toml([], admin=ADMIN)
    tables = ""
    for unit in units:
        cell, revision = CELLS[unit["id"]]
        tables += (
            f'[[units]]\nid = "{unit["id"]}"\nleader = "{unit["leader"]}"\n'
            f'nodes = {json.dumps(unit["nodes"])}\ncell = "{cell}"\nrevision = "{revision}"\n'
        )
    return head + tables


async def start_rollout(operator: str, token: str) -> None:
    """Cell a at 50%, once its new unit is ready: the step it holds while measured."""
    headers = {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
        await start(http, operator, ASK)
        await at_step(http, operator, 0)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    pins = pin_cpus()
    relay_cpu = None if pins is None else pins.relay
    with (
        tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp_name,
        pinned(None if pins is None else pins.load),
        contextlib.ExitStack() as stack,
    ):
        tmp = Path(tmp_name)
        token = secrets.token_urlsafe(32)
        os.environ["UNITGATE_ADMIN_TOKEN"] = token  # the children's admin token
        sim_argv = ["loadtest.simunits", "--units", "4", "--followers", "0", "--ttft-ms", "0"]
        sim_argv += ["--itl-ms", f"{args.itl:g}", "--tokens", str(TOKENS), "--model", MODEL]
        sim = stack.enter_context(
            child([*sim_argv, "--ready-file", str(tmp / "sim.json")], tmp / "sim.json", None, "sim")
        )
        (tmp / "gw.toml").write_text(config(sim["units"]))
        urls, pids, operators = {}, {}, {}
        for side in SIDES:
            ready = tmp / f"{side}.json"
            argv = ["gateway", "gateway", "--config", str(tmp / "gw.toml"), "--log-level"]
            argv += ["warning", "--ready-file", str(ready)]
            info = stack.enter_context(child(argv, ready, relay_cpu, f"{side} gateway", True))
            urls[side], pids[side], operators[side] = (
                info["public"],
                int(info["pid"]),
                info["metrics"],
            )
        uvloop.run(start_rollout(operators["rolling"], token))
        cpu = uvloop.run(rounds(urls, pids, args, SIDES))
    report(cpu, SIDES, LABELS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
