"""`unitgate gateway --log-format json` as an operator runs it, with workers: every line the
control plane and its workers write is one JSON object, and each worker writes the access
lines of the requests it served."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.support import MODEL, ROOT, SimProcess, chat_body, stop_process

CONFIG = """
[gateway]
port = 0
models = ["{model}"]
workers = 2
shutdown_timeout = 5.0

[metrics]
port = 0

[health]
enabled = false

[breaker]
enabled = false

[admin]
enabled = false

[logging]
access = true
format = "text"  # the command line's --log-format wins

[[units]]
id = "u0"
leader = "{leader}"
nodes = ["{leader}"]
"""


def start(tmp: Path, sim: SimProcess) -> tuple[subprocess.Popen[bytes], Path, dict[str, Any]]:
    config, ready, err = tmp / "gw.toml", tmp / "gw.ready", tmp / "gw.err"
    config.write_text(CONFIG.format(model=MODEL, leader=sim.units[0]["leader"]))
    argv = [sys.executable, "-m", "gateway", "gateway", "--config", str(config)]
    with err.open("wb") as f:
        proc = subprocess.Popen(
            [*argv, "--log-format", "json", "--ready-file", str(ready)],
            stderr=f,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=tmp,
        )
    deadline = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            raise AssertionError(f"gateway did not start:\n{err.read_text(errors='replace')}")
        time.sleep(0.05)
    return proc, err, orjson.loads(ready.read_bytes())


async def answered(http: aiohttp.ClientSession, url: str, rid: str) -> int:
    """POST until a worker answers (they may still be starting), within a deadline."""
    deadline = time.monotonic() + 30
    while True:
        try:
            body = chat_body(stream=False, max_tokens=2)
            async with http.post(url, json=body, headers={"x-request-id": rid}) as resp:
                await resp.read()
                return resp.status
        except aiohttp.ClientConnectionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


@pytest.mark.slow  # a control plane and two workers start: about 10 s on a busy machine
async def test_json_lines_from_the_control_plane_and_the_workers(
    clean_sim: SimProcess, tmp_path: Path
) -> None:
    proc, err, ready = start(tmp_path, clean_sim)
    rids = [f"json-{i}" for i in range(6)]
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            url = ready["public"] + "/v1/chat/completions"
            statuses = [await answered(http, url, rid) for rid in rids]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert stop_process(proc, 20.0) == 0
    assert statuses == [200] * len(rids)
    lines = err.read_text().splitlines()
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= set(e) for e in entries)
    access = [e for e in entries if e["logger"] == "unitgate.access"]
    assert sorted(e["request_id"] for e in access) == rids  # once each, from its worker
    assert all(e["process"] == "worker" for e in access)
    assert all(e["status"] == 200 and e["unit"] == "u0" and e["ttft"] is None for e in access)
    assert all(e["completion_tokens"] == 2 and e["outcome"] == "complete" for e in access)
    assert any("process" not in e for e in entries)  # the control plane's own lines
