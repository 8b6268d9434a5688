"""`unitgate up` end to end: one real unit of two nodes behind the in-process gateway.

The tests share one `unitgate up` process and run in file order: ready and serving, a follower
killed and the whole unit restarted, then SIGINT stopping everything with no orphans. They run
twice: the two nodes as tensor parallelism, then as two pipeline stages (`pp = 2`).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.base.ports import free_ports
from tests.engine.test_up_support import Proc, eventually, health, pid_gone, stream_chat, unitgate

pytestmark = pytest.mark.slow


@dataclass
class Up:
    proc: Proc
    url: str
    leader: str  # the leader's API
    nodes: list[str]  # /health, rank order; the leader's on its thread listener
    pids_seen: set[int] = field(default_factory=set)

    def pids(self) -> list[int]:
        pids = [int(health(n)["pid"]) for n in self.nodes]
        self.pids_seen.update(pids)
        return pids


def write_config(
    path: Path, leader: str, nodes: list[str], ports: tuple[int, int], pp: int = 1
) -> None:
    """`ports`: the gateway's and the operator listener's, planned with the units' so that no
    port 0 bind is handed a unit's port before its node binds it."""
    units = ", ".join(f'"{n}"' for n in nodes)
    path.write_text(
        f"[gateway]\nport = {ports[0]}\nshutdown_timeout = 5.0\n[metrics]\nport = {ports[1]}\n"
        '[admin]\nstate_file = ""\n[priority]\n'
        f'[[units]]\nid = "u0"\nleader = "{leader}"\nnodes = [{units}]\npp = {pp}\n'
    )


@pytest.fixture(scope="module", params=[1, 2], ids=["tp2", "pp2"])
def up(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Up]:
    tmp = tmp_path_factory.mktemp("up")
    *listeners, leader, leader_health, follower = free_ports(5)
    leader_url, *nodes = [f"http://127.0.0.1:{p}" for p in (leader, leader_health, follower)]
    ports = (listeners[0], listeners[1])
    write_config(tmp / "config.toml", leader_url, nodes, ports, pp=request.param)
    env = {k: v for k, v in os.environ.items() if k != "UNITGATE_ADMIN_TOKEN"}
    args = ("up", "--config", str(tmp / "config.toml"), "--log-dir", str(tmp))
    proc = unitgate(tmp, "up", *args, env=env)
    running = Up(proc, "", leader_url, nodes)
    try:
        running.url = proc.wait_line("unitgate up ready ", 90)
        yield running
    finally:
        proc.stop()
        for pid in running.pids_seen:  # never leave a node behind, whatever failed
            if not pid_gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_ready_prints_urls_and_a_token_and_serves_through_the_gateway(up: Up) -> None:
    text = up.proc.text()
    assert f"API      {up.url}/v1" in text and "/metrics" in text and "/admin/units" in text
    assert "admin token for this run: " in text
    assert stream_chat(up.url)
    # With [priority], the builtin engine is sent each class's priority and schedules by it.
    assert stream_chat(up.url, priority="interactive") == stream_chat(up.url, priority="batch")
    assert [health(n)["role"] for n in up.nodes] == ["leader", "follower"]
    assert health(up.leader)["pid"] == health(up.nodes[0])["pid"]  # the API answers it too


def test_a_killed_follower_restarts_the_whole_unit(up: Up) -> None:
    old = up.pids()
    os.kill(old[1], signal.SIGKILL)

    def restarted() -> bool:
        new = up.pids()
        return all(p not in old for p in new)

    eventually(restarted, 45, "both nodes restarted with new pids")
    assert all(pid_gone(p) for p in old)
    eventually(lambda: stream_chat(up.url), 30, "a completion through the gateway")
    assert "unit u0: node 1 (follower) exited with -9 (SIGKILL); restarting all 2 nodes" in (
        up.proc.text()
    )


def test_sigint_stops_everything_cleanly(up: Up) -> None:
    pids = up.pids()
    up.proc.proc.send_signal(signal.SIGINT)
    assert up.proc.proc.wait(30) == 0, up.proc.text()[-3000:]
    assert all(pid_gone(p) for p in pids), "orphan node processes"
