"""When is `unitgate up` ready, and what it prints then.

Ready means the gateway routes to every local unit on its own verdict (units are unknown, and
not routable, until a probe round has judged them; a unit let in by panic routing does not
count) AND every node answers its own /health with "ok".
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from engine.up.plan import Plan, UnitPlan
from gateway.api import Config, Gateway, is_routable

POLL_S = 0.2


async def wait_routable(
    gateway: Gateway, plan: Plan, stop: asyncio.Event, within: float, log_dir: Path
) -> int:
    """0 once every local unit is ready (or a stop was asked for), 1 at the deadline."""
    deadline = time.monotonic() + within
    timeout_s = aiohttp.ClientTimeout(total=1.0)
    async with aiohttp.ClientSession(timeout=timeout_s) as session:
        while not stop.is_set():
            waiting = [u.unit for u in plan.units if not await _ready(session, gateway, u)]
            if not waiting:
                return 0
            if time.monotonic() > deadline:
                print(
                    f"unitgate up: units not routable after {within:g} s: "
                    f"{', '.join(waiting)} (node logs in {log_dir})",
                    flush=True,
                )
                return 1
            await asyncio.sleep(POLL_S)
    return 0


async def _ready(session: aiohttp.ClientSession, gateway: Gateway, unit: UnitPlan) -> bool:
    if not is_routable(gateway, unit.unit):
        return False
    checks = [_node_ok(session, n.health_url) for n in unit.nodes]
    return all(await asyncio.gather(*checks))


async def _node_ok(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url) as resp:
            body = await resp.json()
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return False
    return resp.status == 200 and isinstance(body, dict) and body.get("status") == "ok"


def announce(
    config: Config, gateway: Gateway, plan: Plan, log_dir: Path, token: str | None
) -> None:
    """The human part first, then one machine-readable line scripts and tests wait for."""
    nodes = sum(len(u.nodes) for u in plan.units)
    served = sorted({u.leader.served_model for u in plan.units})
    admin = f"{gateway.metrics_url}/admin/units"
    backends = " and ".join(sorted({u.leader.backend for u in plan.units}))
    models = ", ".join(sorted({repr(u.leader.model or "tiny") for u in plan.units}))
    lines = [
        f"unitgate up: {len(plan.units)} units ({nodes} nodes) of the {backends} engine, "
        f"model {models} served as {', '.join(served)}; node logs in {log_dir}",
        f"  API      {gateway.public_url}/v1",
        f"  metrics  {gateway.metrics_url}/metrics",
    ]
    if config.admin.enabled:
        lines.append(f"  admin    {admin}  (Authorization: Bearer ${config.admin.token_env})")
    if token is not None:
        lines.append(f"  admin token for this run: {token}")
        lines.append(f"    export {config.admin.token_env}={token}   # for `unitgate admin`")
    lines.append(f"unitgate up ready {gateway.public_url}")
    print("\n".join(lines), flush=True)
