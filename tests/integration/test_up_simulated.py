"""`unitgate up --simulated` with one replica end to end: one launcher for any number of
replicas (main.py's, as `--replicas N` and the builtin engine use), so it prints the
announcement, keeps the simulator's log and units file in --log-dir, serves the units as the
config loaded them (an environment override of a leader is where the simulated unit listens),
and SIGTERM stops the simulator with it; a simulator that cannot start fails the run, naming
its log."""

from __future__ import annotations

import json
import os
import signal
import socket
import tomllib
import urllib.request
from pathlib import Path

import pytest

from gateway.base.ports import free_ports
from tests.engine.test_up_support import Proc, eventually, pid_gone, stream_chat, unitgate
from tests.support import MODEL

pytestmark = pytest.mark.slow
READY_WITHIN_S = 60.0


def write_config(path: Path, u0: tuple[int, int], u1: int) -> None:
    a, b = (f"http://127.0.0.1:{p}" for p in u0)
    path.write_text(
        f'[gateway]\nport = 0\nmodels = ["{MODEL}"]\nshutdown_timeout = 2.0\n'
        '[metrics]\nport = 0\n[admin]\nstate_file = ""\n'
        f'[[units]]\nid = "u0"\nleader = "{a}"\nnodes = ["{a}", "{b}"]\n'
        f'[[units]]\nid = "u1"\nleader = "http://127.0.0.1:{u1}"\n'
    )


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def test_one_replica_runs_through_up_and_serves_the_units_as_loaded(tmp_path: Path) -> None:
    a, b, in_file, overridden = free_ports(4)
    write_config(tmp_path / "up.toml", (a, b), in_file)
    logs = tmp_path / "logs"
    env = {k: v for k, v in os.environ.items() if k != "UNITGATE_ADMIN_TOKEN"}
    env["UNITGATE__UNITS__1__LEADER"] = f"http://127.0.0.1:{overridden}"
    args = ("up", "--simulated", "--config", str(tmp_path / "up.toml"), "--log-dir", str(logs))
    proc = unitgate(tmp_path, "up", *args, env=env)
    sim_pid = None
    try:
        public = proc.wait_line("unitgate up ready ", READY_WITHIN_S)
        text = proc.text()
        said = f"unitgate up: 2 simulated units (3 nodes) served as {MODEL}; node logs in {logs}"
        assert said in text, proc.tail()
        assert f"  API      {public}/v1" in text and "  admin token for this run: " in text
        # The simulator: a child of `up`, its log, ready file and units file in --log-dir.
        sim_pid = json.loads((logs / "simulated-units.ready").read_text())["pid"]
        assert (logs / "simulated-units.log").exists()
        units = tomllib.loads((logs / "simulated-units.toml").read_text())["units"]
        assert units[1] == {
            "id": "u1",
            "leader": f"http://127.0.0.1:{overridden}",
            "nodes": [f"http://127.0.0.1:{overridden}"],
        }
        # `ready` came once the gateway routed to u1 at the overridden address: it is there.
        health = get_json(f"http://127.0.0.1:{overridden}/health")
        assert isinstance(health, dict) and health["unit"] == "u1", health
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", in_file), timeout=1).close()
        assert stream_chat(public)
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.proc.wait(20) == 0, proc.tail()
        eventually(lambda: pid_gone(sim_pid), 10, "the simulator gone")
    finally:
        _leave_nothing(proc, sim_pid)


def test_a_simulator_that_cannot_start_fails_the_run_naming_its_log(tmp_path: Path) -> None:
    with socket.socket() as held:  # u1's address is taken: the simulator cannot bind it
        held.bind(("127.0.0.1", 0))
        held.listen()
        a, b = free_ports(2)
        write_config(tmp_path / "up.toml", (a, b), held.getsockname()[1])
        logs = tmp_path / "logs"
        args = ("up", "--simulated", "--config", str(tmp_path / "up.toml"), "--log-dir", str(logs))
        proc = unitgate(tmp_path, "up", *args)
        try:
            assert proc.proc.wait(READY_WITHIN_S) == 1, proc.tail()
        finally:
            _leave_nothing(proc, None)
    text = proc.text()
    log = logs / "simulated-units.log"
    said = f"unitgate up: the simulated units exited with 1 before it was ready (its log: {log})"
    assert said in text and "\n    unitgate-sim: " in text, text  # and its log's last lines
    assert "unitgate up ready" not in text


def _leave_nothing(proc: Proc, sim_pid: int | None) -> None:
    proc.stop()
    if sim_pid is not None and not pid_gone(sim_pid):
        os.kill(sim_pid, signal.SIGKILL)
