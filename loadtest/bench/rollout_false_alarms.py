"""`python -m loadtest.bench.rollout_false_alarms`: how often a revision identical to the old
one is rolled back, through the real gateway.

One gateway over four simulated units alike in everything (two cells, each a unit labelled v1
and one labelled v2), a steady load of conversations, and `--rollouts` rollouts one after the
other, alternately v1 to v2 and back (the units a rollout drained are enabled again before the
next). Any rollback is a false alarm: the gates' designed rate is at most `alpha` (0.05) per
rollout. It prints the count, each rollback's reason, and the rate beside alpha.

    python -m loadtest.bench.rollout_false_alarms --rollouts 100 --step-seconds 1.5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sys
import tempfile
from collections import Counter
from pathlib import Path

import aiohttp

from loadtest.bench.processes import MODEL, child, pin_cpus, pinned
from loadtest.bench.rollout_client import Tally, converse, ended, start
from loadtest.bench.rollout_cost import config

CELLS = ("a", "b")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.rollout_false_alarms",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rollouts", type=int, default=100)
    p.add_argument("--step-seconds", type=float, default=1.5)
    p.add_argument("--steps", default="25,100", help="percentages, comma-separated")
    p.add_argument("--concurrency", type=int, default=12, help="conversations at once")
    p.add_argument("--min-samples", type=int, default=30, help="[rollout.gates] min_samples")
    args = p.parse_args(argv)
    if args.rollouts < 1 or args.concurrency < 1 or args.step_seconds <= 0:
        p.error("--rollouts, --concurrency and --step-seconds must be positive")
    return args


async def enable_all(admin: aiohttp.ClientSession, operator: str) -> None:
    async with admin.get(operator + "/admin/units") as resp:
        units = (await resp.json())["units"]
    for unit in units:
        if unit["admin"]["state"] != "enabled":
            async with admin.post(operator + f"/admin/units/{unit['id']}/enable") as resp:
                assert resp.status == 200, await resp.text()


async def run(args: argparse.Namespace, public: str, operator: str, token: str) -> int:
    steps = [int(s) for s in args.steps.split(",")]
    timeout = aiohttp.ClientTimeout(total=60)
    headers = {"Authorization": f"Bearer {token}"}
    outcomes: Counter[str] = Counter()
    reasons: list[str] = []
    tally, stop = Tally(), asyncio.Event()
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        aiohttp.ClientSession(timeout=timeout, headers=headers) as admin,
    ):
        clients = [
            asyncio.create_task(converse(http, public, MODEL, tally, stop))
            for _ in range(args.concurrency)
        ]
        try:
            for n in range(args.rollouts):
                to, old = ("v2", "v1") if n % 2 == 0 else ("v1", "v2")
                await enable_all(admin, operator)
                ask = {"to": to, "from": old, "steps": steps, "step_seconds": args.step_seconds}
                await start(admin, operator, ask)
                done, seconds = await ended(admin, operator, pause_is_an_error=True)
                outcomes[done["state"]] += 1
                if done["state"] != "succeeded":
                    reasons.append(f"rollout {n + 1}: {done['reason']}")
                print(f"rollout {n + 1}: {done['state']} in {seconds:.1f} s", flush=True)
        finally:
            stop.set()
            await asyncio.gather(*clients)
    failed = len(tally.failed)
    rolled_back: int = args.rollouts - outcomes["succeeded"]
    print("\n".join(reasons))
    print(f"\n{rolled_back} of {args.rollouts} identical rollouts rolled back "
          f"({rolled_back / args.rollouts:.1%}; designed: at most alpha, 5%); "
          f"{failed} client requests failed")  # fmt: skip
    return rolled_back


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    pins = pin_cpus()
    with (
        tempfile.TemporaryDirectory(prefix="bench-false-alarms-") as tmp_name,
        pinned(None if pins is None else pins.load),
        contextlib.ExitStack() as stack,
    ):
        tmp = Path(tmp_name)
        token = secrets.token_urlsafe(32)
        os.environ["UNITGATE_ADMIN_TOKEN"] = token  # the gateway's admin token
        sim_argv = ["loadtest.simunits", "--units", "4", "--followers", "0", "--ttft-ms", "5"]
        sim_argv += ["--itl-ms", "2", "--tokens", "6", "--ready-file", str(tmp / "sim.json")]
        sim = stack.enter_context(child(sim_argv, tmp / "sim.json", None, "simulator"))
        gates = f"[rollout.gates]\nmin_samples = {args.min_samples}\n"
        sessions = config(sim["units"]).replace('affinity = "none"', 'affinity = "session"')
        (tmp / "gw.toml").write_text(sessions + gates)
        ready = tmp / "gw.json"
        argv = ["gateway", "gateway", "--config", str(tmp / "gw.toml"), "--log-level", "warning"]
        argv += ["--ready-file", str(ready)]
        cpu = None if pins is None else pins.relay
        gw = stack.enter_context(child(argv, ready, cpu, "gateway", True))
        asyncio.run(run(args, gw["public"], gw["metrics"], token))
    return 0


if __name__ == "__main__":
    sys.exit(main())
