"""Sweeps end to end: in process against SimCluster, and through the CLI in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from loadtest.gen import sweep
from loadtest.gen.cli import run_load
from loadtest.gen.plots import try_write_plots
from loadtest.gen.shapes import RunConfig
from loadtest.gen.stats import Slo
from loadtest.gen.workload import Workload, WorkloadConfig
from loadtest.simunits import Settings, SimCluster
from tests.support import ROOT, start_sim, stop_process

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


async def test_sweep_runs_each_point_and_writes_results(tmp_path: Path) -> None:
    async with SimCluster(units=1, followers=0, settings=Settings(5, 1, 4)) as sim:
        base = RunConfig(url=sim.units[0].leader_url, concurrency=1, requests=6)
        seen: list[RunConfig] = []

        async def load(point: RunConfig, session: aiohttp.ClientSession) -> dict[str, object]:
            seen.append(point)
            work = Workload(WorkloadConfig("unitgate-sim", seed=3))
            return await run_load(point, work, Slo(), progress=False, session=session)

        rows = await sweep.run_sweep(base, "concurrency", [1, 3], load, tmp_path, try_write_plots)
    assert [(p.concurrency, p.rate, p.requests) for p in seen] == [(1, None, 6), (3, None, 6)]
    assert [row["concurrency"] for row in rows] == [1, 3]
    assert all(row["error rate"] == 0.0 and row["req/s"] for row in rows)
    for i in range(2):
        result = json.loads((tmp_path / f"point-{i}" / "result.json").read_text())
        assert result["summary"]["succeeded"] == 6
        assert (tmp_path / f"point-{i}" / "latency_cdf.png").read_bytes()[:8] == PNG_SIGNATURE
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["axis"] == "concurrency" and len(doc["points"]) == 2
    assert doc["points"][1]["TTFT p50 ms"] >= 4.0
    table = sweep.sweep_table("concurrency", rows).splitlines()
    assert len(table) == 3 and "req/s" in table[0]


def test_point_config_switches_the_shape() -> None:
    base = RunConfig(url="http://x", concurrency=1, duration=2.0)
    point = sweep.point_config(base, "rate", 4)
    assert (point.concurrency, point.rate, point.duration) == (None, 4.0, 2.0)


def _loadtest(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "loadtest", *args], cwd=ROOT, capture_output=True, timeout=60
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def test_cli_rate_sweep_against_a_sim_subprocess(tmp_path: Path) -> None:
    process = start_sim(tmp_path, "--units", "1", "--followers", "0", "--ttft-ms", "5",
                        "--itl-ms", "1", "--tokens", "4")  # fmt: skip
    try:
        out = tmp_path / "sweep"
        done = _loadtest("--url", str(process.units[0]["leader"]), "--sweep-rate", "20,40",
                         "--duration", "0.5", "--no-progress", "--out", str(out),
                         "--slo", "ttft_p50=1ms")  # fmt: skip
    finally:
        stop_process(process.proc)
    # Every point is judged: the 5 ms TTFT misses a 1 ms objective at both, so the sweep fails.
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert "checks: 2 failed" in lines
    assert [line.split()[:4] for line in lines if line.startswith("  FAIL")] == [
        ["FAIL", "rate", "20:", "ttft_p50"],
        ["FAIL", "rate", "40:", "ttft_p50"],
    ]
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["point", "rate"])
    assert [line.split()[:2] for line in lines[header + 1 : header + 3]] == [
        ["0", "20.0"],
        ["1", "40.0"],
    ]
    doc = json.loads((out / "sweep.json").read_text())
    assert [p["rate"] for p in doc["points"]] == [20.0, 40.0]
    for i in range(2):
        result = json.loads((out / f"point-{i}" / "result.json").read_text())
        assert result["config"]["shape"] == "open"
        assert [c["passed"] for c in result["checks"]] == [True, False]
        assert (out / f"point-{i}" / "latency_cdf.png").stat().st_size > 5000


@pytest.mark.parametrize(
    "args",
    [
        ("--sweep-rate", "1,x"),
        ("--sweep-concurrency", "0,2"),
        ("--sweep-concurrency", "1,2", "--concurrency", "3"),
        ("--sweep-concurrency", "1", "--sweep-rate", "1"),
    ],
)
def test_cli_rejects_bad_sweeps(args: tuple[str, ...]) -> None:
    done = _loadtest("--url", "http://x", "--requests", "1", *args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "--" in done.stderr
