"""Helpers shared by the tests: the sim subprocess, gateway configs, request bodies."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from gateway.base.readyfile import wait_ready_blocking
from gateway.config import Config, config_from_dict
from gateway.routing.affinity import affinity_key, hash_key, rank

if TYPE_CHECKING:
    from gateway.server import Gateway

ROOT = Path(__file__).resolve().parents[1]
MODEL = "unitgate-sim"


@dataclass(eq=False)
class FakeUnit:
    """A unit as the routing policies see it (identity equality, like UnitState)."""

    id: str
    inflight: int = 0
    weight: float = 1.0
    cap: int = 1000
    foreign: int = 0  # other replicas' requests, as the leader reported them

    @property
    def key_hash(self) -> int:
        return hash_key(self.id)


@dataclass
class SimProcess:
    """A `unitgate sim` subprocess and its control API."""

    proc: subprocess.Popen[bytes]
    control: str
    units: list[dict[str, Any]]

    def post(self, path: str, payload: dict[str, Any] | None = None) -> Any:
        data = json.dumps(payload or {}).encode()
        req = urllib.request.Request(self.control + path, data=data, method="POST")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read() or b"null")

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.control + path, timeout=5) as resp:
            return json.loads(resp.read())

    def stats(self, unit_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.get(f"/units/{unit_id}/stats")
        return result

    def total(self, key: str) -> int:
        return sum(self.stats(u["id"])[key] for u in self.units)

    def fault(self, unit_id: str, mode: str, **params: Any) -> None:
        self.post(f"/units/{unit_id}/fault", {"mode": mode, **params})


def start_sim(tmp: Path, *args: str) -> SimProcess:
    ready = tmp / "sim.ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadtest.simunits", "--ready-file", str(ready), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    info = wait_ready_blocking(ready, proc, 30.0, "the simulated units")
    return SimProcess(proc, info["control"], info["units"])


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def gateway_config(units: list[dict[str, Any]], **sections: dict[str, Any]) -> Config:
    raw: dict[str, Any] = {
        "gateway": {"port": 0, "models": [MODEL], "shutdown_timeout": 5.0},
        "metrics": {"port": 0},
        "routing": {"affinity": "none"},
        # Request-path tests want no prober or breaker deciding behind their back.
        "health": {"enabled": False},
        "breaker": {"enabled": False},
        "admin": {"enabled": False},
        "units": [{"id": u["id"], "leader": u["leader"], "nodes": u["nodes"]} for u in units],
    }
    for name, values in sections.items():
        if name == "units":
            raise ValueError("pass units as the first argument")
        raw[name] = {**raw.get(name, {}), **values}
    return config_from_dict(raw)


async def until_routable(gw: Gateway, *unit_ids: str, within: float = 5.0) -> None:
    """Wait (with a deadline) until the gateway routes to these units (default: every unit):
    with probes on, units are unknown, and not routable, until a probe round has judged them."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    wanted = unit_ids or tuple(gw.units.units)
    while not all(gw.units.units[u].routable for u in wanted):
        if loop.time() > deadline:
            states = {u: gw.units.units[u].health.value for u in wanted}
            raise AssertionError(f"units not routable within {within} s: {states}")
        await asyncio.sleep(0.01)


def usage_counts(usage: dict[str, Any]) -> dict[str, Any]:
    """A usage's token counts: what a resumed stream's usage (the gateway's own) says. It has
    no `prompt_tokens_details`: how much of the client's prompt the first unit had cached is
    not known once its answer broke off."""
    return {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def chat_body(stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello there"}],
        "stream": stream,
        **extra,
    }


async def sse_events(
    resp: aiohttp.ClientResponse, after_each: Callable[[list[Any]], None] | None = None
) -> list[Any]:
    """Every SSE data payload of a streamed answer, parsed, "[DONE]" kept as that string.
    `after_each` sees the list after every event (to inject a fault at a chosen point)."""
    events: list[Any] = []
    async for line in resp.content:
        if line.startswith(b"data: "):
            payload = line[6:].strip()
            events.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
            if after_each is not None:
                after_each(events)
    return events


async def sim_stats(http: aiohttp.ClientSession, sim: Any, unit_id: str) -> dict[str, Any]:
    """Non-blocking read of a simulated unit's counters (the gateway shares this event loop)."""
    async with http.get(f"{sim.control}/units/{unit_id}/stats") as resp:
        result: dict[str, Any] = await resp.json()
        return result


async def sim_total(http: aiohttp.ClientSession, sim: Any, key: str) -> int:
    return sum([(await sim_stats(http, sim, u["id"]))[key] for u in sim.units])


def session_ranking_first(unit_id: str, others: list[str]) -> str:
    """A session key whose rendezvous favourite is `unit_id`: makes the first pick deterministic."""
    fakes = [FakeUnit(u) for u in [unit_id, *others]]
    for i in range(1000):
        key = affinity_key("session", f"s{i}", "")
        assert key is not None
        if rank(key, fakes)[0].id == unit_id:
            return f"s{i}"
    raise AssertionError("no key found")
