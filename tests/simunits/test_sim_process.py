"""`python -m loadtest.simunits` as a real process: readiness, serving, and SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gateway.base.ports import free_port
from gateway.base.readyfile import wait_ready_blocking

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 15.0


def _http(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return json.loads(resp.read())


def _config_args(tmp_path: Path) -> list[str]:
    leader, follower = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[gateway]\nport = 8000\n\n[[units]]\nid = "alpha"\nleader = "{leader}"\n'
        f'nodes = ["{leader}", "{follower}"]\n'
    )
    return ["--from-config", str(config)]


@pytest.mark.parametrize("topology", ["generated", "from-config"])
def test_process_serves_and_stops_on_sigterm(tmp_path: Path, topology: str) -> None:
    ready = tmp_path / "ready.json"
    args = (
        ["--units", "1", "--followers", "1"] if topology == "generated" else _config_args(tmp_path)
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loadtest.simunits",
            "--ready-file",
            str(ready),
            "--tokens",
            "3",
            *args,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
    )
    try:
        info = wait_ready_blocking(ready, proc, DEADLINE_S, "the simulated units")
        assert info["pid"] == proc.pid
        (unit,) = info["units"]
        assert len(unit["nodes"]) == 2 and unit["nodes"][0] == unit["leader"]
        assert proc.stdout is not None
        assert proc.stdout.readline().decode() == f"unitgate-sim ready {info['control']}\n"
        body = {"messages": [{"role": "user", "content": "hi"}]}
        reply = _http(unit["leader"] + "/v1/chat/completions", body)
        assert reply["choices"][0]["message"]["content"] == "tok0 tok1 tok2 "
        assert _http(unit["nodes"][1] + "/health")["step"] == 3
        # A request hung in flight must not hold up shutdown.
        _http(f"{info['control']}/units/{unit['id']}/fault", {"mode": "hang"})
        host, port = unit["leader"].removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as hung:
            hung.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 14\r\n\r\n"
                b'{"prompt":"x"}'
            )
            deadline = time.monotonic() + DEADLINE_S
            while _http(f"{info['control']}/units/{unit['id']}/stats")["in_flight"] != 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=DEADLINE_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
