"""`unitgate node`: a leader and a follower as two real processes on 127.0.0.1."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.base.ports import free_port
from tests.engine.test_runtime_support import ROOT
from tests.engine.test_up_support import MODEL, Proc, health, stream_chat, unitgate

pytestmark = pytest.mark.slow


def node(tmp: Path, role: str, rank: int, master: str, *flags: str) -> Proc:
    common = ("--unit", "u9", "--world-size", "2", "--master", master, "--threads", "1")
    return unitgate(tmp, role, "node", "--role", role, "--rank", str(rank), *common, *flags)


def test_leader_serves_the_api_and_sigterm_stops_both(tmp_path: Path) -> None:
    master, port, hport = f"127.0.0.1:{free_port()}", free_port(), free_port()
    follower = node(tmp_path, "follower", 1, master, "--health-port", str(hport))
    leader = node(tmp_path, "leader", 0, master, "--port", str(port))
    try:
        assert leader.wait_line("health_port=", 60) == str(port)  # no listener of its own
        assert leader.wait_line("api_port=", 1) == str(port)
        url = f"http://127.0.0.1:{port}"
        assert (health(url)["role"], health(url)["unit"]) == ("leader", "u9")
        assert stream_chat(url, model="tiny")
        assert health(f"http://127.0.0.1:{hport}")["rank"] == 1
        leader.proc.send_signal(signal.SIGTERM)
        assert leader.proc.wait(20) == 0, leader.text()[-2000:]
        assert follower.proc.wait(20) == 0, follower.text()[-2000:]  # STOP reached it
    finally:
        leader.stop()
        follower.stop()


def test_a_leader_given_a_health_port_answers_health_there(tmp_path: Path) -> None:
    """The thread listener: the same fields as the API port's /health, and it goes away with
    the leader (SIGTERM stops it before the API, and the process still exits 0)."""
    port, hport = free_port(), free_port()
    leader = unitgate(
        tmp_path, "solo", "node", "--role", "leader", "--world-size", "1", "--unit", "u7",
        "--master", f"127.0.0.1:{free_port()}", "--port", str(port), "--threads", "1",
        "--health-port", str(hport),
    )  # fmt: skip
    try:
        assert leader.wait_line("health_port=", 60) == str(hport)
        assert leader.wait_line("api_port=", 1) == str(port)
        own = health(f"http://127.0.0.1:{hport}")
        assert (own["status"], own["role"], own["rank"], own["unit"]) == ("ok", "leader", 0, "u7")
        assert health(f"http://127.0.0.1:{port}")["pid"] == own["pid"] == leader.proc.pid
        assert stream_chat(f"http://127.0.0.1:{port}", model="tiny")
        leader.proc.send_signal(signal.SIGTERM)
        assert leader.proc.wait(20) == 0, leader.tail()
    finally:
        leader.stop()
    with pytest.raises(OSError):
        health(f"http://127.0.0.1:{hport}")


def test_served_model_name_is_what_the_leader_accepts(tmp_path: Path) -> None:
    port = free_port()
    leader = unitgate(
        tmp_path, "solo", "node", "--role", "leader", "--world-size", "1",
        "--master", f"127.0.0.1:{free_port()}", "--port", str(port), "--threads", "1",
        "--served-model-name", MODEL,
    )  # fmt: skip
    try:
        leader.wait_line("health_port=", 60)
        assert stream_chat(f"http://127.0.0.1:{port}", model=MODEL)
    finally:
        leader.stop(signal.SIGTERM)
    assert leader.proc.returncode == 0


def test_bad_flags_give_one_line() -> None:
    args = ["node", "--role", "leader", "--rank", "1", "--world-size", "2"]
    done = subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["unitgate node: --rank: a leader has rank 0, got 1"]
