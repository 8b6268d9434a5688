"""`unitgate up --simulated --replicas N` end to end: real processes, a real redis-server.

One `up` process per test, in front of simulated units on free ports, its gateways on
OS-assigned ports (read from its announcement). Every child of `up` is found in /proc, so
"nothing left behind" is checked on the real process table, after SIGTERM and after kill -9.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.base.ports import free_ports
from tests.engine.test_up_support import Proc, eventually, pid_gone, stream_chat, unitgate
from tests.redis_support import redis_server
from tests.support import MODEL

pytestmark = pytest.mark.slow
TOKEN = "fleet-token"
READY_WITHIN_S = 60.0
REPLICA = re.compile(
    r"^  replica (\d+)  API (\S+)/v1  metrics (\S+)/metrics  admin \S+/admin/units  \(pid (\d+)"
)


@dataclass
class Replica:
    public: str
    ops: str
    pid: int


@dataclass
class Fleet:
    proc: Proc
    replicas: list[Replica]
    children: list[int]  # every direct child of `up`: redis-server, simulator, replicas
    ready_after_s: float

    def admin(self, index: int, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.replicas[index].ops + path, data, method=method)
        req.add_header("Authorization", f"Bearer {TOKEN}")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())


def write_config(path: Path, state: str = "") -> None:
    """Two simulated units of two nodes each on ports planned together; the gateways' on 0."""
    a, b, c, d = (f"http://127.0.0.1:{p}" for p in free_ports(4))
    path.write_text(
        f'[gateway]\nport = 0\nmodels = ["{MODEL}"]\nshutdown_timeout = 5.0\n'
        '[metrics]\nport = 0\n[admin]\nstate_file = ""\n'
        f"{state}"
        f'[[units]]\nid = "u0"\nleader = "{a}"\nnodes = ["{a}", "{b}"]\n'
        f'[[units]]\nid = "u1"\nleader = "{c}"\nnodes = ["{c}", "{d}"]\n'
    )


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def command(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def start_fleet(tmp: Path, replicas: int = 2) -> Fleet:
    env = {**os.environ, "UNITGATE_ADMIN_TOKEN": TOKEN}
    args = ("up", "--simulated", "--replicas", str(replicas), "--config", str(tmp / "up.toml"))
    started = time.monotonic()
    proc = unitgate(tmp, "up", *args, "--log-dir", str(tmp / "logs"), env=env)
    try:
        urls = proc.wait_line("unitgate up ready ", READY_WITHIN_S).split()
        ready_after = time.monotonic() - started
        found = [REPLICA.match(line) for line in proc.text().splitlines()]
        where = [Replica(m[2], m[3], int(m[4])) for m in found if m is not None]
        assert [r.public for r in where] == urls and len(urls) == replicas, proc.tail()
        return Fleet(proc, where, children_of(proc.proc.pid), ready_after)
    except BaseException:
        kill_all(proc)
        raise


def kill_all(proc: Proc) -> None:
    """Whatever failed, leave nothing behind."""
    children = children_of(proc.proc.pid)
    proc.stop()
    for pid in children:
        if not pid_gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    write_config(tmp_path / "up.toml")
    running = start_fleet(tmp_path)
    try:
        yield running
    finally:
        kill_all(running.proc)


def test_two_replicas_serve_share_a_disable_and_stop_in_order(fleet: Fleet) -> None:
    print(f"--replicas 2 ready after {fleet.ready_after_s:.2f} s")
    commands = [command(pid) for pid in fleet.children]
    assert sum("redis-server" in c for c in commands) == 1, commands
    assert sum("loadtest.simunits" in c for c in commands) == 1, commands
    assert fleet.replicas[1].pid in fleet.children and fleet.replicas[0].pid == fleet.proc.proc.pid
    for replica in fleet.replicas:
        assert stream_chat(replica.public)
    fleet.admin(0, "POST", "/admin/units/u0/disable", {"reason": "repair"})

    def disabled_on_replica_1() -> bool:
        view = fleet.admin(1, "GET", "/admin/units/u0")
        return bool(view["admin"]["state"] == "disabled" and not view["routable"])

    eventually(disabled_on_replica_1, 2.0, "replica 1 sees the disable made through replica 0")
    fleet.proc.proc.send_signal(signal.SIGTERM)
    assert fleet.proc.proc.wait(30) == 0, fleet.proc.tail()
    assert all(pid_gone(pid) for pid in fleet.children), "a child of up outlived it"
    text = fleet.proc.text()
    said = [text.index(line) for line in STOP_ORDER]
    assert said == sorted(said), text[-2000:]


STOP_ORDER = (
    "stopping: gateways drain",
    "every gateway replica stopped",
    "every unit stopped",
    "redis-server stopped",
)


def test_kill_9_of_up_takes_every_child_with_it(tmp_path: Path) -> None:
    write_config(tmp_path / "up.toml")
    fleet = start_fleet(tmp_path, replicas=3)
    try:
        assert len(fleet.children) == 4  # redis-server, the simulator, replicas 1 and 2
        fleet.proc.proc.kill()
        fleet.proc.proc.wait(10)
        eventually(lambda: all(pid_gone(p) for p in fleet.children), 10.0, "children gone")
    finally:
        kill_all(fleet.proc)


def test_a_configured_redis_is_used_and_up_starts_none(tmp_path: Path) -> None:
    with redis_server(tmp_path / "theirs") as theirs:
        state = f'[state]\nbackend = "redis"\nurl = "{theirs.url}"\nkey_prefix = "demo"\n'
        write_config(tmp_path / "up.toml", state)
        fleet = start_fleet(tmp_path)
        try:
            assert not any("redis-server" in command(pid) for pid in fleet.children)
            assert f"shared through the config's [state] store at {theirs.url}" in fleet.proc.text()
            fleet.admin(1, "POST", "/admin/units/u1/drain", {"reason": "kernel"})
            assert theirs.client().hget("demo:marks", "u1") is not None

            def draining_on_replica_0() -> bool:
                view = fleet.admin(0, "GET", "/admin/units/u1")
                return bool(view["admin"]["state"] in ("draining", "drained"))

            eventually(draining_on_replica_0, 2.0, "replica 0 sees the drain through their redis")
            fleet.proc.proc.send_signal(signal.SIGTERM)
            assert fleet.proc.proc.wait(30) == 0, fleet.proc.tail()
            assert all(pid_gone(pid) for pid in fleet.children)
        finally:
            kill_all(fleet.proc)
