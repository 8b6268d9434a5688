"""Rollouts with replicas sharing a real redis-server: one replica drives, every replica applies
its split and counts its answers, an operator may steer through any of them, and a driver
killed with SIGKILL hands the rollout over to another replica, which carries on from the same
step.

The cells and units are test_rollouts.py's: cell a holds u0 (v1) and u1 (v2), cell b u2 (v1)
and u3 (v2). The clients' load goes through a replica that does not drive, so the driver's
gates pass only on samples another replica sent it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.config import Config
from gateway.config.state import StateConfig
from gateway.server import Gateway, running
from tests.integration.test_rollouts import (
    GATES,
    GOLDEN,
    NEW,
    OLD,
    Remote,
    add_new_units,
    admin,
    cells_sim,
    config,
    finished,
    gateway_process,
    loaded,
    sim,
)
from tests.redis_support import RedisServer
from tests.support import SimProcess

pytestmark = pytest.mark.usefixtures("admin_tokens")
__all__ = ["cells_sim", "sim"]  # fixtures, shared with test_rollouts.py

TTL = 1.5  # [state].replica_ttl: how long a dead driver's lease lasts


def shared(sim: SimProcess, store: RedisServer, replica: str) -> Config:
    state = StateConfig(
        backend="redis", url=store.url, key_prefix="fleet", replica=replica, replica_ttl=TTL
    )
    return dataclasses.replace(config(sim), state=state)


@contextlib.asynccontextmanager
async def two(sim: SimProcess, store: RedisServer) -> AsyncIterator[tuple[Gateway, Gateway]]:
    async with running(shared(sim, store, "r0")) as a, running(shared(sim, store, "r1")) as b:
        yield a, b


async def rollout_events(http: aiohttp.ClientSession, gw: Any, rollout: str) -> list[Any]:
    _, events = await admin(http, gw, "GET", "/admin/events?limit=500")
    return [e for e in events["events"] if e["unit"] == f"rollout:{rollout}"]


async def until(check: Any, within: float) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "not in time"
        await asyncio.sleep(0.05)


async def test_one_replica_drives_and_judges_the_answers_of_another(
    sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    async with two(sim, store) as (a, b):
        await add_new_units(http, a, sim)
        await until(lambda: _true(all(u in b.units.units for u in NEW)), within=3.0)
        async with loaded(http, b) as load:  # every answer through r1
            ask = {"to": "v2", "steps": [50, 100], "step_seconds": 1.0, "gates": GATES,
                   "golden": GOLDEN}  # fmt: skip
            status, started = await admin(http, a, "POST", "/admin/rollouts", ask)
            assert status == 201, started
            assert "note" not in started  # the shared store keeps it over restarts
            status, again = await admin(http, b, "POST", "/admin/rollouts", ask)
            assert status == 409 and started["id"] in again["error"]["message"], again

            # r1 applies r0's split, and steers it through r0.
            await until(lambda: _true(b.units.canary is not None), within=5.0)
            status, paused = await admin(http, b, "POST", "/admin/rollouts/current/pause")
            assert status == 200 and paused["state"] == "paused", paused
            assert a.admin is not None and a.admin.rollouts is not None
            assert a.admin.rollouts.current is not None
            assert a.admin.rollouts.current.state == "paused"
            status, resumed = await admin(http, b, "POST", "/admin/rollouts/current/resume")
            assert status == 200 and resumed["state"] == "running", resumed
            done = await finished(http, b, within=40)
        assert done["state"] == "succeeded", done
        assert load.failed == []
        assert load.served["u1"] > 0 and load.served["u3"] > 0
        for gw in (a, b):
            await until(lambda g=gw: _true(g.units.canary is None), within=3.0)  # type: ignore[misc]
            assert dict(gw.units.revisions.serving) == {"a": "v2", "b": "v2"}
        _, listed = await admin(http, b, "GET", "/admin/rollouts")
        assert [r["id"] for r in listed["rollouts"]] == [started["id"]]
        story = [e["what"] for e in await rollout_events(http, b, started["id"])]
        assert story[0] == "rollout started" and story[-1] == "rollout succeeded", story
        assert story.count("rollout step") == 4 and "rollout taken over" not in story
        units = {u["id"]: u for u in (await admin(http, b, "GET", "/admin/units"))[1]["units"]}
        assert {units[u]["admin"]["state"] for u in OLD} == {"drained"}


STATE = """[state]
backend = "redis"
url = "{url}"
key_prefix = "fleet"
replica = "{replica}"
replica_ttl = {ttl}
"""


def replica_process(
    tmp: Path, sim: SimProcess, store: RedisServer, replica: str
) -> contextlib.AbstractContextManager[tuple[subprocess.Popen[bytes], Remote]]:
    state = STATE.format(url=store.url, replica=replica, ttl=TTL)
    return gateway_process(tmp, sim, replica, extra=state)


@pytest.mark.slow  # two gateway processes start: a few seconds each on a busy machine
async def test_a_driver_killed_mid_step_hands_the_rollout_over(
    sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    with (
        replica_process(tmp_path, sim, store, "r0") as (driver, a),
        replica_process(tmp_path, sim, store, "r1") as (_, b),
    ):
        async with loaded(http, b) as load:
            ask = {"to": "v2", "steps": [50, 100], "step_seconds": 3.0, "gates": GATES}
            status, started = await admin(http, a, "POST", "/admin/rollouts", ask)
            assert status == 201, started

            async def first_step() -> bool:
                status, current = await admin(http, b, "GET", "/admin/rollouts/current")
                return status == 200 and (current["cell"], current["step"]) == ("a", 0)

            await until(first_step, within=10.0)
            await asyncio.sleep(0.5)  # the step's samples start to come in; its event is out
            driver.kill()
            killed = time.time()
            driver.wait(5)
            done = await finished(http, b, within=60)
        assert done["state"] == "succeeded", (done["reason"], done["gates"])
        assert load.failed == []
        story = await rollout_events(http, b, started["id"])
        taken = [e for e in story if e["what"] == "rollout taken over"]
        assert len(taken) == 1 and "replica r1" in taken[0]["reason"], story
        assert "cell a, step 1" in taken[0]["reason"]  # carried on from the same step
        handed_over_s = taken[0]["time"] - killed
        print(f"handed over {handed_over_s:.2f} s after the kill (replica_ttl {TTL} s)")
        assert handed_over_s <= TTL + 1.5
        steps = [e["reason"].split(":")[0] for e in story if e["what"] == "rollout step"]
        assert steps == ["cell a", "cell a", "cell b", "cell b"], story  # none run twice


async def _true(value: bool) -> bool:
    return value
