"""The `unitgate gateway` process: start-up errors, readiness file, graceful SIGTERM drain."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from gateway.base.readyfile import wait_ready_blocking
from tests.support import ROOT, SimProcess, chat_body


def _config_toml(sim: SimProcess) -> str:
    lines = [
        "[gateway]\nport = 0\nshutdown_timeout = 10.0\n",
        "[metrics]\nport = 0\n",
        "[admin]\nenabled = false\n",
        "[health]\nenabled = false\n",
    ]
    for unit in sim.units:
        nodes = ", ".join(f'"{n}"' for n in unit["nodes"])
        lines.append(
            f'[[units]]\nid = "{unit["id"]}"\nleader = "{unit["leader"]}"\nnodes = [{nodes}]\n'
        )
    return "\n".join(lines)


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[timeouts]\nidle = -3\n")
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "gateway", "--config", str(cfg)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "[timeouts].idle must be a positive number, got -3.0" in done.stderr


@pytest.mark.slow
async def test_sigterm_drains_in_flight_streams(clean_sim: SimProcess, tmp_path: Path) -> None:
    for unit in clean_sim.units:
        clean_sim.post(f"/units/{unit['id']}/settings", {"itl_ms": 50, "tokens": 20})
    cfg = tmp_path / "gw.toml"
    cfg.write_text(_config_toml(clean_sim))
    ready = tmp_path / "gw.ready.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway",
            "gateway",
            "--config",
            str(cfg),
            "--ready-file",
            str(ready),
        ],
        cwd=ROOT,
    )
    try:
        info = await asyncio.to_thread(wait_ready_blocking, ready, proc, 30.0, "the gateway")
        async with aiohttp.ClientSession() as http:
            resp = await http.post(info["public"] + "/v1/chat/completions", json=chat_body())
            first = await resp.content.readany()
            proc.send_signal(signal.SIGTERM)
            rest = await resp.read()
            text = (first + rest).decode()
            assert text.endswith("data: [DONE]\n\n"), text[-200:]
            assert "tok19 " in text
            code = await asyncio.to_thread(proc.wait, 15)
            assert code == 0
            with pytest.raises(aiohttp.ClientConnectionError):
                await http.get(info["public"] + "/healthz")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
