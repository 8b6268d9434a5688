"""Processes for the chaos suite: real builtin-engine units under `unitgate up`, simulated units
with a gateway process in front, and the faults they take (signals by pid from /health).

Every process started here is stopped in a `finally` (fixtures call `close`), SIGCONT first
so a frozen process can take its SIGTERM, SIGKILL after a deadline, and every node pid ever
seen is checked: nothing outlives the suite, even when a scenario fails halfway.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gateway.base.ports import free_port
from loadtest.readyfile import wait_http_ok
from tests.chaos.harness import RESUME_SECTION
from tests.chaos.ops import Ops
from tests.support import ROOT, SimProcess, start_sim, stop_process

REAL_MODEL = "tiny"


# UNITGATE_CHAOS_WORKERS=2 runs the simulated scenarios against a control plane and two
# workers (`make test` runs them both ways), instead of one gateway process.
WORKERS = int(os.environ.get("UNITGATE_CHAOS_WORKERS", "1"))


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return orjson.dumps(value).decode()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table, e.g. one of [[priority.classes]]
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def config_toml(sections: dict[str, dict[str, Any]], units: list[dict[str, Any]]) -> str:
    """A gateway config, with the suite's `[resume]` section (see RESUME_ON)."""
    sections = {**sections, "resume": RESUME_SECTION}
    out = []
    for name, values in sections.items():
        out.append(f"[{name}]")
        out += [f"{k} = {toml_value(v)}" for k, v in values.items()]
        out.append("")
    for unit in units:
        out.append("[[units]]")
        out += [f"{k} = {toml_value(v)}" for k, v in unit.items()]
        out.append("")
    return "\n".join(out)


def gateway_sections(model: str, **overrides: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Probes and breaker on (as in production), a short `idle` so a frozen unit is noticed,
    affinity off so both units share the load evenly, the admin API on for drain and events."""
    sections: dict[str, dict[str, Any]] = {
        "gateway": {"port": free_port(), "models": [model], "shutdown_timeout": 10.0},
        "metrics": {"port": free_port()},
        "timeouts": {"connect": 1.0, "first_byte": 3.0, "idle": 2.0, "total": 60.0},
        "routing": {"affinity": "none"},
        "health": {"enabled": True, "interval": 0.25, "timeout": 0.5, "fall": 2, "rise": 2},
        "breaker": {"enabled": True},
        "admin": {"enabled": True, "state_file": ""},
    }
    for name, values in overrides.items():
        sections[name] = {**sections.get(name, {}), **values}
    return sections


def get_json(url: str, timeout: float = 2.0) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        doc: dict[str, Any] = orjson.loads(resp.read())
        return doc


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def signal_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def reap(proc: subprocess.Popen[bytes], grace: float) -> int:
    """SIGCONT (a stopped process ignores SIGTERM until continued), SIGTERM, then SIGKILL."""
    if proc.poll() is None:
        signal_pid(proc.pid, signal.SIGCONT)
    return stop_process(proc, grace)


# --- real units ---------------------------------------------------------------------------


@dataclass
class RealCluster:
    """`unitgate up` running units of the builtin engine (TP=2 each) and its gateway."""

    proc: subprocess.Popen[bytes]
    out: Path
    public: str
    ops: Ops
    nodes: dict[str, list[str]]  # unit id -> node URLs, rank order
    pids_seen: set[int] = field(default_factory=set)

    def node_pid(self, unit: str, rank: int) -> int:
        pid = int(get_json(self.nodes[unit][rank] + "/health")["pid"])
        self.pids_seen.add(pid)
        return pid

    def ready(self) -> bool:
        """Every unit routable with every node ok, as the gateway sees it (the prober's view)."""
        views = {u["id"]: u for u in self.ops.units()}
        for unit in self.nodes:
            view = views[unit]
            if not view["routable"] or not all(n["healthy"] for n in view["nodes"]):
                return False
            for rank in range(len(self.nodes[unit])):
                self.node_pid(unit, rank)
        return True

    def log_tail(self, chars: int = 3000) -> str:
        return self.out.read_text(errors="replace")[-chars:]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            for unit, urls in self.nodes.items():
                for rank in range(len(urls)):
                    signal_pid(self.node_pid(unit, rank), signal.SIGCONT)
        for pid in self.pids_seen:
            signal_pid(pid, signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM) if self.proc.poll() is None else None
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid in self.pids_seen:  # never leave a node behind, whatever failed
            if pid_alive(pid):
                signal_pid(pid, signal.SIGKILL)


def start_real(tmp: Path, units: int = 2, world: int = 2, within: float = 150.0) -> RealCluster:
    nodes = {
        f"u{i}": [f"http://127.0.0.1:{free_port()}" for _ in range(world)] for i in range(units)
    }
    sections = gateway_sections(REAL_MODEL)
    unit_tables = [
        # nodes[0] is the leader's own /health listener (a thread), its API a port of its own.
        {"id": uid, "leader": f"http://127.0.0.1:{free_port()}", "nodes": urls, "max_inflight": 8}
        for uid, urls in nodes.items()
    ]
    config = tmp / "up.toml"
    config.write_text(config_toml(sections, unit_tables))
    token = secrets.token_urlsafe(32)
    out = tmp / "up.out"
    with out.open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "up", "--config", str(config), "--log-dir", str(tmp)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "UNITGATE_ADMIN_TOKEN": token, "PYTHONPATH": str(ROOT)},
            cwd=tmp,
        )
    public = f"http://127.0.0.1:{sections['gateway']['port']}"
    ops = Ops(f"http://127.0.0.1:{sections['metrics']['port']}", token)
    cluster = RealCluster(proc, out, public, ops, nodes)
    try:
        deadline = time.monotonic() + within
        while "unitgate up ready " not in out.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"unitgate up did not get ready:\n{cluster.log_tail()}")
            time.sleep(0.2)
        cluster.ready()
    except BaseException:
        cluster.close()
        raise
    return cluster


# --- simulated units behind a gateway process ---------------------------------------------


@dataclass
class GatewayProcess:
    proc: subprocess.Popen[bytes]
    out: Path
    public: str
    ops: Ops

    def log_tail(self, chars: int = 3000) -> str:
        return self.out.read_text(errors="replace")[-chars:]

    def close(self) -> None:
        reap(self.proc, 15.0)


def start_gateway(
    tmp: Path, sim: SimProcess, model: str, **overrides: dict[str, Any]
) -> GatewayProcess:
    """A gateway process in front of the simulator, returned once its /readyz says it routes."""
    return spawn_gateway(tmp, *gateway_config(tmp, sim, model, **overrides))


def gateway_config(
    tmp: Path, sim: SimProcess, model: str, **overrides: dict[str, Any]
) -> tuple[Path, str]:
    """The config file (fixed free ports, so a restart binds the same ones) and admin token."""
    sections = gateway_sections(model, **overrides)
    units = [{"id": u["id"], "leader": u["leader"], "nodes": u["nodes"]} for u in sim.units]
    config = tmp / "gateway.toml"
    config.write_text(config_toml(sections, units))
    return config, secrets.token_urlsafe(16)


def spawn_gateway(
    tmp: Path, config: Path, token: str, routes: bool = True, name: str = "gateway"
) -> GatewayProcess:
    """Start `unitgate gateway`; returned once it listens, and with `routes` once its /readyz
    answers 200 (units are unknown until a probe round has judged them)."""
    ready = tmp / f"{name}.ready.json"
    ready.unlink(missing_ok=True)
    out = tmp / f"{name}.out"
    argv = [sys.executable, "-m", "gateway", "gateway", "--config", str(config)]
    with out.open("wb") as f:
        proc = subprocess.Popen(
            [*argv, "--ready-file", str(ready)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "UNITGATE_ADMIN_TOKEN": token, "PYTHONPATH": str(ROOT)},
            cwd=tmp,
        )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not start:\n{out.read_text(errors='replace')}")
            time.sleep(0.05)
        info = orjson.loads(ready.read_bytes())
        if routes:
            wait_http_ok(info["public"] + "/readyz", proc, 30.0, "the gateway")
    except BaseException:
        reap(proc, 5.0)
        raise
    return GatewayProcess(proc, out, info["public"], Ops(info["metrics"], token))


def start_replicas(
    tmp: Path,
    sim: SimProcess,
    model: str,
    names: list[str],
    state: dict[str, Any],
    **overrides: dict[str, Any],
) -> list[GatewayProcess]:
    """Gateway processes in front of the simulator, one per name, sharing `[state]` (a Redis
    backend) and one admin token: the fleet of replicas an L4 balancer would sit in front of.
    Each has its own config file, OS-assigned ports and `[state].replica` name (two
    processes of one host would otherwise differ by pid only, and the tests name who
    reported what). Returned once every one routes; if one fails to start, those started
    are stopped."""
    token = secrets.token_urlsafe(32)
    units = [{"id": u["id"], "leader": u["leader"], "nodes": u["nodes"]} for u in sim.units]
    started: list[GatewayProcess] = []
    try:
        for name in names:
            sections = gateway_sections(model, **overrides, state={**state, "replica": name})
            # Bound by the OS at start and read from the ready file: nothing to race for (no
            # replica is restarted on its old ports here, unlike `gateway_config`'s users).
            sections["gateway"]["port"] = sections["metrics"]["port"] = 0
            config = tmp / f"{name}.toml"
            config.write_text(config_toml(sections, units))
            started.append(spawn_gateway(tmp, config, token, name=name))
    except BaseException:
        for gw in started:
            gw.close()
        raise
    return started


def start_simulator(tmp: Path, units: int = 3) -> SimProcess:
    return start_sim(tmp, "--units", str(units), "--followers", "1")
