"""The leader /health benchmark runs end to end at its smallest sizes: a real two-node unit,
both endpoints probed idle and saturated, the table printed and the JSON written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_the_benchmark_probes_both_endpoints_idle_and_saturated(tmp_path: Path) -> None:
    argv = ["--out", str(tmp_path), "--idle", "1", "--window", "2", "--rate", "10"]
    argv += ["--concurrency", "6", "--num-slots", "2", "--max-tokens", "8"]
    proc = subprocess.run(
        [sys.executable, "-m", "loadtest.bench.leader_health", *argv],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "health port (thread)" in proc.stdout and "API port (event loop)" in proc.stdout
    report = json.loads((tmp_path / "leader_health.json").read_text())
    for phase in ("idle", "saturated"):
        for endpoint in ("api", "thread"):
            summary = report["phases"][phase][endpoint]
            assert summary["probes"] >= 5 and summary["errors"] == 0, (phase, endpoint, summary)
    assert report["leader_load"]["pending_max"] >= 3  # more requests than KV slots: queued
    assert (tmp_path / "logs" / "leader.log").exists()
