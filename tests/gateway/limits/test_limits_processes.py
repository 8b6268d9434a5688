"""Three replicas as three processes on one real redis-server, each with its Limiter flushing
in the background, over a minute run 10 times faster than real time
(tests/gateway/limits/limits_replica.py): 300 requests at 120 rpm, then the same with Redis killed
at second 10 and back at second 40."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.redis_support import RedisServer, redis_server

# Counts admissions across processes over real time windows: it runs alone in `make test`.
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parents[3]
SPEED = 10.0  # the simulated minute lasts 6 s
REPLICAS, REQUESTS = 3, 100  # each: 300 in all, one every 0.2 simulated seconds


def start_replicas(server: RedisServer, start: float) -> list[subprocess.Popen[bytes]]:
    common = [repr(start), str(SPEED), str(REQUESTS)]
    module = [sys.executable, "-m", "tests.gateway.limits.limits_replica", str(server.socket)]
    return [
        subprocess.Popen(
            [*module, f"r{i}", *common, str(i), str(REPLICAS)], cwd=ROOT, stdout=subprocess.PIPE
        )
        for i in range(REPLICAS)
    ]


def results(procs: list[subprocess.Popen[bytes]]) -> list[dict[str, object]]:
    found = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        found.append(json.loads(out.decode().strip().splitlines()[-1]))
    return found


@pytest.mark.slow
def test_three_processes_at_120_rpm_admit_120_of_300(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as server:
        found = results(start_replicas(server, time.time() + 2.0))
    admitted = sum(int(str(r["admitted"])) for r in found)
    calls = sum(int(str(r["store_calls"])) for r in found)
    degraded = [r["degraded"] for r in found]
    print(f"\n3 processes, 300 requests at 120 rpm: {admitted} admitted, {calls} store calls")
    # 120 exactly unless a call timed out on a loaded machine: then that replica admitted its
    # share on its own for a moment (the documented policy), which the issue allows as +-1
    assert 119 <= admitted <= (121 if any(degraded) else 120), degraded


@pytest.mark.slow
def test_redis_killed_under_load_the_shares_hold_and_the_fleet_recovers(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as server:
        start = time.time() + 2.0
        procs = start_replicas(server, start)
        time.sleep(max(0.0, start + 10 / SPEED - time.time()))
        server.kill()
        time.sleep(max(0.0, start + 40 / SPEED - time.time()))
        server.start()
        found = results(procs)
    admitted = sum(int(str(r["admitted"])) for r in found)
    print(f"\n3 processes, Redis away from second 10 to 40: {admitted} admitted")
    assert all(r["degraded"] for r in found)
    assert not any(r["degraded_at_end"] for r in found)
    assert 110 <= admitted <= 121
