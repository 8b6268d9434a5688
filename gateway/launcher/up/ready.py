"""When is `unitgate up` ready, and what it prints then.

Ready means the gateway routes to every local unit on its own verdict (units are unknown, and
not routable, until a probe round has judged them; a unit let in by panic routing does not
count) AND every node answers its own /health with "ok". With `--replicas N`, every replica
must be ready so: replica 0 is judged here, each child replica judges itself the same way
(replica.py) and says so through its ready file.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from gateway.api import Config, Gateway, is_routable
from gateway.launcher.up.plan import Plan, UnitPlan
from gateway.launcher.up.processes import log_tail
from gateway.launcher.up.replicas import ReplicaSupervisor, Where

POLL_S = 0.2


async def wait_routable(
    gateway: Gateway, plan: Plan, stop: asyncio.Event, within: float, log_dir: Path
) -> int:
    """0 once every local unit `ready` waits for is ready (or a stop was asked for), 1 at the
    deadline."""
    deadline = time.monotonic() + within
    timeout_s = aiohttp.ClientTimeout(total=1.0)
    async with aiohttp.ClientSession(timeout=timeout_s) as session:
        while not stop.is_set():
            waiting = [u.unit for u in plan.awaited if not await _ready(session, gateway, u)]
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


async def wait_fleet(
    gateway: Gateway,
    replicas: Sequence[ReplicaSupervisor],
    plan: Plan,
    stop: asyncio.Event,
    within: float,
    log_dir: Path,
) -> int:
    """0 once replica 0 (this process's gateway) and every child replica route to every local
    unit, or a stop was asked for; 1 as soon as one of them fails (each says why)."""
    waits = [asyncio.ensure_future(wait_routable(gateway, plan, stop, within, log_dir))]
    waits += [asyncio.ensure_future(_replica_ready(r, stop, within)) for r in replicas]
    try:
        for done in asyncio.as_completed(waits):
            if await done != 0:
                return 1
    finally:
        for wait in waits:
            wait.cancel()
    return 0


async def _replica_ready(replica: ReplicaSupervisor, stop: asyncio.Event, within: float) -> int:
    stopped = asyncio.ensure_future(stop.wait())
    either: list[asyncio.Future[Any]] = [replica.first_ready, stopped]
    try:
        await asyncio.wait(either, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    index, log_path = replica.ports.index, replica.log
    if stop.is_set():
        return 0
    if not replica.first_ready.done():
        print(
            f"unitgate up: replica {index} not ready after {within:g} s (its log: {log_path})",
            flush=True,
        )
        return 1
    result = replica.first_ready.result()
    if isinstance(result, int):
        tail = await asyncio.to_thread(log_tail, log_path)
        print(
            f"unitgate up: replica {index} exited with {result} before it was ready "
            f"(its log: {log_path}){tail}",
            flush=True,
        )
        return 1
    return 0


def describe_units(plan: Plan, simulated: bool) -> str:
    """The announcement's first words: what runs beside the gateways."""
    nodes = sum(len(u.nodes) for u in plan.units)
    served = ", ".join(sorted({u.leader.served_model for u in plan.units}))
    if simulated:
        return f"{len(plan.units)} simulated units ({nodes} nodes) served as {served}"
    backends = " and ".join(sorted({u.leader.backend for u in plan.units}))
    models = ", ".join(sorted({repr(u.leader.model or "tiny") for u in plan.units}))
    return (
        f"{len(plan.units)} units ({nodes} nodes) of the {backends} engine, "
        f"model {models} served as {served}"
    )


def announce(
    config: Config,
    fleet: Sequence[Where],
    units: str,
    log_dir: Path,
    token: str | None,
    store: str | None = None,
) -> None:
    """The human part first, then one machine-readable line scripts and tests wait for: every
    replica's public URL, replica 0's first."""
    lines = [f"unitgate up: {units}; node logs in {log_dir}"]
    admin = config.admin.enabled
    auth = f"(Authorization: Bearer ${config.admin.token_env})"
    if len(fleet) == 1:
        (one,) = fleet
        lines += [f"  API      {one.public_url}/v1", f"  metrics  {one.metrics_url}/metrics"]
        if admin:
            lines.append(f"  admin    {one.metrics_url}/admin/units  {auth}")
    else:
        shared = f"admin state shared through {store}" if store else "no admin state to share"
        lines.append(f"  {len(fleet)} gateway replicas, {shared}")
        for where in fleet:
            line = f"  replica {where.index}  API {where.public_url}/v1"
            line += f"  metrics {where.metrics_url}/metrics"
            if admin:
                line += f"  admin {where.metrics_url}/admin/units"
            log = "this process" if where.log is None else f"log {where.log}"
            lines.append(f"{line}  (pid {where.pid}, {log})")
        if admin:
            lines.append(f"  admin    {auth}")
    if token is not None:
        lines.append(f"  admin token for this run: {token}")
        lines.append(f"    export {config.admin.token_env}={token}   # for `unitgate admin`")
    if admin:
        lines.append(status_line(fleet[0].metrics_url, token, config.admin.token_env))
    lines.append("unitgate up ready " + " ".join(where.public_url for where in fleet))
    print("\n".join(lines), flush=True)


def status_line(ops_url: str, token: str | None, token_env: str) -> str:
    """The status page; with a token made for this run, a link that signs it in. The token
    is in the URL's fragment, which a browser never sends to the server, so no log holds it."""
    if token is None:
        return f"  status   {ops_url}/status  (sign in with ${token_env})"
    return f"  status   {ops_url}/status#token={quote(token, safe='')}"
