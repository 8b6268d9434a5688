"""Scenario actions fired during real runs against simulated units, over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from loadtest.gen.cli import run_load
from loadtest.gen.scenario import parse_scenario
from loadtest.gen.shapes import RunConfig
from loadtest.gen.stats import Slo
from loadtest.gen.timeseries import failover
from loadtest.gen.workload import Workload, WorkloadConfig
from loadtest.simunits import Settings, SimCluster
from tests.support import ROOT

TOKEN = "s3cret"


@pytest.fixture
async def sim() -> AsyncIterator[SimCluster]:
    async with SimCluster(units=1, followers=0, settings=Settings(5, 2, 4)) as running:
        yield running


async def _serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)
    ]
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@contextlib.asynccontextmanager
async def loop_lateness() -> AsyncIterator[list[float]]:
    """The most this event loop ran a 10 ms timer late meanwhile (`[0]`): a busy 2-core CI
    machine can starve the process for half a second, which no scheduler can make up for, so
    an action's allowed lateness is the scheduler's own slack plus that."""
    worst = [0.0]

    async def probe() -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(0.01)
            worst[0] = max(worst[0], time.perf_counter() - start - 0.01)

    task = asyncio.create_task(probe())
    try:
        yield worst
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _load(url: str, actions: list[dict[str, Any]], duration: float) -> dict[str, Any]:
    run = RunConfig(url=url, rate=40.0, duration=duration, timeout=5.0)
    work = Workload(WorkloadConfig("unitgate-sim", seed=1))
    result = await run_load(run, work, Slo(), False, parse_scenario({"actions": actions}))
    return result  # type: ignore[return-value]


async def test_signals_fire_on_time_with_pid_from_health(
    sim: SimCluster, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "unhealthy", "pid": sleepers[1].pid}, status=503)

    app = web.Application()
    app.router.add_get("/health", health)
    async for health_url in _serve(app):
        actions = [
            {"at": 0.3, "signal": "term", "pid": sleepers[0].pid},
            {"at": 0.6, "signal": "kill", "health_url": health_url},
            {"at": 0.7, "signal": "kill", "health_url": "http://127.0.0.1:1"},
        ]
        async with loop_lateness() as late:
            result = await _load(sim.units[0].leader_url, actions, 1.0)
    assert sleepers[0].wait(5) == -signal.SIGTERM
    assert sleepers[1].wait(5) == -signal.SIGKILL
    fired = result["actions"]
    assert [a["outcome"] for a in fired[:2]] == ["ok", "ok"]
    assert fired[1]["detail"] == f"pid {sleepers[1].pid}"
    assert fired[2]["outcome"].startswith("ClientConnectorError")  # reported, not raised
    for a in fired:
        assert a["at"] <= a["fired_s"] <= a["at"] + 0.2 + late[0], (a, late[0])
    assert result["summary"]["failed"] == 0


@pytest.mark.parametrize(
    ("late", "stop_at", "cont_at", "duration"),
    [(0.0, 0.2, 0.5, 0.8), (0.5, 0.1, 0.3, 1.5)],
    ids=["found", "still_out"],
)
async def test_cont_signals_the_pid_its_stop_found(
    sim: SimCluster,
    sleepers: list[subprocess.Popen[bytes]],
    late: float,
    stop_at: float,
    cont_at: float,
    duration: float,
) -> None:
    """A frozen node cannot answer /health: `cont` uses the pid the `stop` found there.
    `still_out`: the stop's /health answers after the cont's time has come (a loaded
    machine); the cont waits for that lookup and signals after the stop, never before it,
    which would leave the node frozen (CI of b30b0d4 lost the race the other way: the cont
    asked the frozen node)."""
    answered: list[str] = []

    async def health(request: web.Request) -> web.Response:
        if answered:  # frozen now: never answers (the action's own timeout would strike)
            await asyncio.sleep(60)
        answered.append(request.path)
        await asyncio.sleep(late)
        return web.json_response({"status": "ok", "pid": sleepers[0].pid})

    app = web.Application()
    app.router.add_get("/health", health)
    async for health_url in _serve(app):
        actions = [
            {"at": stop_at, "signal": "stop", "health_url": health_url},
            {"at": cont_at, "signal": "cont", "health_url": health_url},
        ]
        result = await _load(sim.units[0].leader_url, actions, duration)
    fired = result["actions"]
    assert [a["outcome"] for a in fired] == ["ok", "ok"], fired
    assert [a["detail"] for a in fired] == [f"pid {sleepers[0].pid}"] * 2
    assert answered == ["/health"]  # asked once, by the stop
    assert _proc_state(sleepers[0].pid) != "T"  # running again


def _proc_state(pid: int) -> str:
    """R, S, T (stopped), ... from /proc/PID/stat."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
async def admin() -> AsyncIterator[tuple[str, list[tuple[str, str | None, Any]]]]:
    calls: list[tuple[str, str | None, Any]] = []

    async def act(request: web.Request) -> web.Response:
        calls.append((request.path, request.headers.get("Authorization"), await request.json()))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"error": {"message": "forbidden"}}, status=403)
        return web.json_response({"id": request.match_info["id"]})

    app = web.Application()
    app.router.add_post("/admin/units/{id}/{action}", act)
    async for url in _serve(app):
        yield url, calls


async def test_admin_actions_carry_token_and_reason(
    sim: SimCluster, admin: tuple[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, calls = admin
    monkeypatch.setenv("UNITGATE_ADMIN_TOKEN", TOKEN)
    actions = [
        {"at": 0.2, "admin": "disable", "unit": "u0", "admin_url": url},
        {"at": 0.4, "admin": "enable", "unit": "u1", "reason": "back", "admin_url": url},
        {"at": 5.0, "admin": "drain", "unit": "u0", "admin_url": url},
    ]
    result = await _load(sim.units[0].leader_url, actions, 0.8)
    assert calls == [
        ("/admin/units/u0/disable", f"Bearer {TOKEN}", {"reason": "loadtest scenario"}),
        ("/admin/units/u1/enable", f"Bearer {TOKEN}", {"reason": "back"}),
    ]
    fired = result["actions"]
    assert [a["outcome"] for a in fired[:2]] == ["ok", "ok"]
    assert fired[2]["outcome"].startswith("not run") and fired[2]["fired_s"] is None
    assert fired[0]["failover_s"] == 0.0 and fired[0]["failed_after"] == 0
    monkeypatch.setenv("UNITGATE_ADMIN_TOKEN", "wrong")
    result = await _load(sim.units[0].leader_url, actions[:1], 0.4)
    assert result["actions"][0]["outcome"].startswith("HTTP 403")


async def test_sim_fault_failover_and_series_totals(sim: SimCluster) -> None:
    control = {"control": sim.control_url, "unit": "u0"}
    actions = [
        {"at": 1.2, "sim_fault": {**control, "mode": "error", "status": 500}},
        {"at": 2.2, "sim_fault": {**control, "mode": "none"}},
    ]
    result = await _load(sim.units[0].leader_url, actions, 3.5)
    summary, buckets = result["summary"], result["timeseries"]["buckets"]
    assert summary["failed"] > 20 and set(summary["errors"]) == {"http_500"}
    broken, cleared = result["actions"]
    # Each action's failover is counted from when it fired, on the run's own series (which
    # buckets a loaded machine filled is its business: failover() itself is tested exactly
    # in test_gen_scenario.py) ...
    for action in (broken, cleared):
        seconds, failed = failover(buckets, action["fired_s"])
        assert seconds is not None and action["failover_s"] == pytest.approx(seconds, abs=0.002)
        assert action["failed_after"] == failed
    assert broken["failed_after"] == summary["failed"]  # every failure came after the fault
    # ... and the load is clean again by the end of the second the clearing action fired in.
    clean_by = math.floor(cleared["fired_s"]) + 1
    assert 0 < broken["fired_s"] + broken["failover_s"] <= clean_by + 0.001
    assert sum(b["started"] for b in buckets) == summary["requests"]
    assert sum(b["completed"] for b in buckets) == summary["succeeded"]
    assert sum(b["failed"] for b in buckets) == summary["failed"]
    assert sum(b["errors"].get("http_500", 0) for b in buckets) == summary["failed"]
    assert sum(b["output_tokens"] for b in buckets) == pytest.approx(summary["output_tokens"])
    assert buckets[0]["failed"] == 0 and buckets[0]["ttft_p50_ms"] is not None


def _loadtest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadtest", "--no-progress", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_cli_prints_actions_and_writes_them(sim: SimCluster, tmp_path: Path) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        f'[[actions]]\nat = 0.3\nsim_fault = {{ control = "{sim.control_url}", unit = "u0", '
        'mode = "error", status = 503, count = 3 }\n'
    )
    # The injected failures are the point here, so the error-rate check is relaxed.
    args = (
        "--url",
        sim.units[0].leader_url,
        "--rate",
        "30",
        "--duration",
        "1.2",
        "--max-error-rate",
        "0.5",
    )
    done = await asyncio.to_thread(
        _loadtest, *args, "--scenario", str(scenario), "--out", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert "PASS  error_rate" in done.stdout
    assert "Actions" in done.stdout and "sim_fault u0 error: ok" in done.stdout
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["actions"][0]["failed_after"] == 3
    assert result["summary"]["errors"] == {"http_503": 3}
    assert len(result["timeseries"]["buckets"]) >= 2


def test_cli_rejects_a_bad_scenario_naming_the_key(tmp_path: Path) -> None:
    scenario = tmp_path / "bad.toml"
    scenario.write_text('[[actions]]\nat = 1\nsignal = "hup"\npid = 99\n')
    done = _loadtest("--url", "http://127.0.0.1:1", "--requests", "1", "--scenario", str(scenario))
    assert done.returncode == 2
    assert "actions[0].signal" in done.stderr and "Traceback" not in done.stderr
