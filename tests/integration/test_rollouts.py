"""Rollouts end to end: a real gateway in front of simulated units in two cells, a client
sending a steady load of conversations, and the admin API driving revisions through the cells.

Cell a holds u0 (v1) and u1 (v2), cell b u2 (v1) and u3 (v2). The config file carries the old
units; the new ones join through the admin API, as an operator (or a prepare hook) adds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.config import Config, config_from_dict
from gateway.server import Gateway, running
from loadtest.bench.rollout_client import Tally, converse
from tests.support import MODEL, ROOT, SimProcess, start_sim, stop_process

pytestmark = pytest.mark.usefixtures("admin_tokens")

AUTH = {"Authorization": "Bearer alice-token"}
OLD = {"u0": "a", "u2": "b"}
NEW = {"u1": "a", "u3": "b"}
# Small gates for short steps: a handful of samples per revision is enough to judge. The
# simulated units answer their first token in 5 ms, of which the gateway's and the simulator's
# own scheduling on a loaded 2-core machine can shift one unit's median by 10% for a whole
# step (measured once in the main suite: 3.5 ms against 3.0 ms, p = 0.0005): a slower median
# fails here only if 50% slower (a slow revision is 60 times slower).
GATES = {"min_samples": 8, "latency_min_effect": 0.5}
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
GOLDEN = [
    {"body": {"model": MODEL, "messages": [{"role": "user", "content": "2+2?"}]}},
    {
        "body": {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Paris?"}],
            "tools": [WEATHER],
        }
    },
]


@pytest.fixture(scope="module")
def cells_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    tmp = tmp_path_factory.mktemp("rollout-sim")
    sim = start_sim(tmp, "--units", "4", "--ttft-ms", "5", "--itl-ms", "2", "--tokens", "6")
    yield sim
    stop_process(sim.proc)


@pytest.fixture
def sim(cells_sim: SimProcess) -> SimProcess:
    cells_sim.post("/reset")
    return cells_sim


def config(
    sim: SimProcess, state_file: Path | None = None, hooks: dict[str, Any] | None = None
) -> Config:
    units = {u["id"]: u for u in sim.units}
    return config_from_dict(
        {
            "rollout": {"hooks": hooks or {}},
            "gateway": {"port": 0, "models": [MODEL], "shutdown_timeout": 5.0},
            "metrics": {"port": 0},
            "routing": {"affinity": "session"},
            "health": {"enabled": False},
            "breaker": {"enabled": False},
            "admin": {"enabled": True, "state_file": str(state_file or "")},
            "units": [
                {"id": i, "leader": units[i]["leader"], "cell": cell, "revision": "v1"}
                for i, cell in OLD.items()
            ],
        }
    )


async def admin(
    http: aiohttp.ClientSession, gw: Any, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    async with http.request(method, gw.metrics_url + path, json=body, headers=AUTH) as resp:
        return resp.status, await resp.json()


async def add_new_units(http: aiohttp.ClientSession, gw: Gateway, sim: SimProcess) -> None:
    leaders = {u["id"]: u["leader"] for u in sim.units}
    for unit_id, cell in NEW.items():
        body = {"id": unit_id, "leader": leaders[unit_id], "cell": cell, "revision": "v2"}
        status, answer = await admin(http, gw, "POST", "/admin/units", body)
        assert status == 201, answer
        assert answer["routable"] is False and "rollout" in answer["idle"]


@contextlib.asynccontextmanager
async def loaded(http: aiohttp.ClientSession, gw: Any) -> AsyncIterator[Tally]:
    """Conversations of three turns each, four at a time, until the block ends."""
    tally, stop = Tally(), asyncio.Event()
    clients = [converse(http, gw.public_url, MODEL, tally, stop) for _ in range(4)]
    task = asyncio.ensure_future(asyncio.gather(*clients))
    try:
        yield tally
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def finished(http: aiohttp.ClientSession, gw: Any, within: float) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        status, current = await admin(http, gw, "GET", "/admin/rollouts/current")
        assert status == 200, current
        if current["state"] not in ("running", "paused"):
            found: dict[str, Any] = current
            return found
        assert asyncio.get_running_loop().time() < deadline, current
        await asyncio.sleep(0.1)


async def test_a_good_revision_rolls_through_every_cell_in_order(
    sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    async with running(config(sim)) as gw:
        await add_new_units(http, gw, sim)
        async with loaded(http, gw) as load:
            ask = {
                "to": "v2",
                "steps": [50, 100],
                "step_seconds": 1.0,
                "gates": GATES,
                "golden": GOLDEN,
            }
            status, started = await admin(http, gw, "POST", "/admin/rollouts", ask)
            assert status == 201, started
            assert started["from"] == "v1" and started["cells"] == ["a", "b"]
            assert "state_file" in started["note"]  # no state file: a restart ends it
            status, again = await admin(http, gw, "POST", "/admin/rollouts", ask)
            assert status == 409 and started["id"] in again["error"]["message"]
            done = await finished(http, gw, within=30)
        assert done["state"] == "succeeded", done
        assert load.failed == []
        assert load.served["u1"] > 0 and load.served["u3"] > 0
        # The old units are drained, the cells serve v2.
        units = {u["id"]: u for u in (await admin(http, gw, "GET", "/admin/units"))[1]["units"]}
        assert (
            units["u0"]["admin"]["state"] == "drained"
            and units["u2"]["admin"]["state"] == "drained"
        )
        assert units["u1"]["routable"] and units["u3"]["routable"]
        assert dict(gw.units.revisions.serving) == {"a": "v2", "b": "v2"}
        _, events = await admin(http, gw, "GET", "/admin/events?limit=200")
        story = [
            (e["what"], e["reason"])
            for e in events["events"]
            if e["unit"] == f"rollout:{done['id']}"
        ]
        whats = [w for w, _ in story]
        assert whats[0] == "rollout started" and whats[-1] == "rollout succeeded"
        steps = [r for w, r in story if w == "rollout step"]
        assert [s.split(":")[0] for s in steps] == ["cell a", "cell a", "cell b", "cell b"]
        assert whats.count("rollout cell done") == 2
        _, verdict = await admin(http, gw, "GET", "/admin/rollouts/current/verdict")
        assert verdict["verdict"] == "pass"


async def test_a_slow_revision_is_rolled_back_in_the_first_cell(
    sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    for unit_id in NEW:
        sim.post(f"/units/{unit_id}/settings", {"ttft_ms": 305})
    async with running(config(sim)) as gw:
        await add_new_units(http, gw, sim)
        async with loaded(http, gw) as load:
            ask = {"to": "v2", "steps": [50, 100], "step_seconds": 1.5, "gates": GATES}
            status, started = await admin(http, gw, "POST", "/admin/rollouts", ask)
            assert status == 201, started
            done = await finished(http, gw, within=30)
        assert done["state"] == "rolled_back", done
        assert "ttft" in done["reason"] and "cell a" in done["reason"], done["reason"]
        assert load.failed == []
        assert load.served["u3"] == 0  # cell b never sent the bad revision a request
        share = load.served["u1"] / sum(load.served.values())
        print(f"share of requests on the slow revision: {share:.1%}")
        assert gw.units.canary is None
        assert dict(gw.units.revisions.serving) == {"a": "v1", "b": "v1"}
        _, verdict = await admin(http, gw, "GET", "/admin/rollouts/current/verdict")
        assert verdict["verdict"] == "fail"


async def test_a_revision_that_breaks_streams_is_rolled_back_and_no_client_sees_it(
    sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    for seed, unit_id in enumerate(NEW):
        fault = {"mode": "drop", "after_tokens": 3, "rate": 0.05, "seed": seed}
        sim.post(f"/units/{unit_id}/fault", fault)
    async with running(config(sim)) as gw:
        await add_new_units(http, gw, sim)
        async with loaded(http, gw) as load:
            ask = {"to": "v2", "steps": [50, 100], "step_seconds": 30, "gates": GATES}
            status, started = await admin(http, gw, "POST", "/admin/rollouts", ask)
            assert status == 201, started
            done = await finished(http, gw, within=30)
            rolled_back = asyncio.get_running_loop().time()
        assert done["state"] == "rolled_back", done
        assert done["reason"].startswith("guard in cell a: ") and "break" in done["reason"]
        assert load.failed == []  # every broken stream was resumed on an old unit
        assert load.served["u3"] == 0
        seconds = done["ended"] - done["since"]
        print(f"rolled back {seconds:.1f} s into the first step ({rolled_back:.0f})")
        assert seconds < 15  # the guards, well before the step's end


async def test_a_revision_that_breaks_tool_calls_fails_before_any_traffic(
    sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    for unit_id in NEW:
        sim.post(f"/units/{unit_id}/settings", {"tools": "text"})
    async with running(config(sim)) as gw:
        await add_new_units(http, gw, sim)
        async with loaded(http, gw) as load:
            ask = {"to": "v2", "step_seconds": 1, "gates": GATES, "golden": GOLDEN}
            status, started = await admin(http, gw, "POST", "/admin/rollouts", ask)
            assert status == 201, started
            done = await finished(http, gw, within=20)
        assert done["state"] == "rolled_back", done
        assert done["reason"].startswith("gate golden in cell a: "), done["reason"]
        assert "tool" in done["reason"]
        assert [g["gate"] for g in done["gates"]] == ["golden"]
        assert load.served["u1"] == load.served["u3"] == 0  # before its first step


# A prepare hook as an operator would write one: it adds the cell's new unit through the admin
# API (the gateway's operator URL and the unit's leader are in files the test writes).
ADD_UNIT = """
import json, os, sys, urllib.request
where = json.load(open(sys.argv[1]))
cell, to = os.environ["UNITGATE_ROLLOUT_CELL"], os.environ["UNITGATE_ROLLOUT_TO"]
unit = where["units"][cell]
body = json.dumps({"id": unit["id"], "leader": unit["leader"], "cell": cell, "revision": to})
request = urllib.request.Request(where["admin"] + "/admin/units", body.encode(), method="POST")
request.add_header("Authorization", "Bearer alice-token")
request.add_header("Content-Type", "application/json")
urllib.request.urlopen(request, timeout=5).read()
"""


async def test_hooks_add_the_new_units_and_hear_how_it_ended(
    sim: SimProcess, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    script, where, told = tmp_path / "add.py", tmp_path / "where.json", tmp_path / "told.json"
    script.write_text(ADD_UNIT)
    hooks = {
        "add": {"command": [sys.executable, str(script), str(where)], "when": ["prepare"]},
        "tell": {
            "command": [sys.executable, "-c", f"import os; open({str(told)!r}, 'a').write("
                        "os.environ['UNITGATE_ROLLOUT_CONTEXT'] + '\\n')"],
            "when": ["done", "rollback"],
        },
    }  # fmt: skip
    leaders = {u["id"]: u["leader"] for u in sim.units}
    async with running(config(sim, hooks=hooks)) as gw:
        units = {cell: {"id": i, "leader": leaders[i]} for i, cell in NEW.items()}
        where.write_text(orjson.dumps({"admin": gw.metrics_url, "units": units}).decode())
        async with loaded(http, gw) as load:
            ask = {"to": "v2", "from": "v1", "steps": [100], "step_seconds": 1, "gates": GATES,
                   "hooks": ["add", "tell"]}  # fmt: skip
            status, started = await admin(http, gw, "POST", "/admin/rollouts", ask)
            assert status == 201, started  # no unit carries v2 yet: the prepare hook adds them
            done = await finished(http, gw, within=30)
        assert done["state"] == "succeeded", done
        assert load.failed == [] and load.served["u1"] > 0 and load.served["u3"] > 0
        assert set(gw.units.units) == {"u0", "u1", "u2", "u3"}
        deadline = asyncio.get_running_loop().time() + 10
        while True:  # the done hooks run once the rollout is recorded done
            _, events = await admin(http, gw, "GET", f"/admin/events?unit=rollout:{done['id']}")
            whats = [e["what"] for e in events["events"]]
            if "rollout hook tell" in whats:
                break
            assert asyncio.get_running_loop().time() < deadline, whats
            await asyncio.sleep(0.05)
        hooks_run = [w for w in whats if w.startswith("rollout hook")]
        assert hooks_run == ["rollout hook add", "rollout hook add", "rollout hook tell"]
        lines = told.read_text().splitlines()
        assert [orjson.loads(line)["moment"] for line in lines] == ["done"]
        context = orjson.loads(lines[0])
        assert context["rollout_id"] == done["id"] and context["to"] == "v2"


async def test_bad_asks_are_refused_by_name_and_change_nothing(
    sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    async with running(config(sim)) as gw:
        await add_new_units(http, gw, sim)
        before = dict(gw.units.revisions.serving)
        for ask, field_name in [
            ({"to": "v9"}, "to"),
            ({"to": "v2", "steps": [50, 25, 100]}, "steps"),
            ({"to": "v2", "steps": [5, 50]}, "steps"),
            ({"to": "v2", "cells": ["nowhere"]}, "cells"),
            ({"to": "v2", "hooks": ["undefined"]}, "hooks"),
            ({"to": "v2", "gates": {"alpah": 0.1}}, "gates.alpah"),
            ({"to": "v2", "step_seconds": -1}, "step_seconds"),
            ({"to": "v2", "colour": "red"}, "colour"),
            ({"to": "v1"}, "from"),
        ]:
            status, answer = await admin(http, gw, "POST", "/admin/rollouts", ask)
            assert status == 400, (ask, answer)
            assert answer["error"]["message"].startswith(field_name), (ask, answer)
        assert gw.units.canary is None and dict(gw.units.revisions.serving) == before
        status, _ = await admin(http, gw, "GET", "/admin/rollouts/current")
        assert status == 404
        status, _ = await admin(http, gw, "POST", "/admin/rollouts/current/abort")
        assert status == 404


async def test_new_units_not_ready_in_time_roll_it_back(
    sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    async with running(config(sim)) as gw:
        leaders = {u["id"]: u["leader"] for u in sim.units}
        body = {
            "id": "u1",
            "leader": leaders["u1"],
            "cell": "a",
            "revision": "v2",
            "enabled": False,
        }
        assert (await admin(http, gw, "POST", "/admin/units", body))[0] == 201
        ask = {"to": "v2", "cells": ["a"], "ready_timeout": 0.5, "step_seconds": 1}
        status, started = await admin(http, gw, "POST", "/admin/rollouts", ask)
        assert status == 201, started
        done = await finished(http, gw, within=10)
        assert done["state"] == "rolled_back"
        assert "not ready within 0.5 s" in done["reason"] and "none" in done["reason"]
        assert gw.units.canary is None


async def test_a_restarted_gateway_carries_on_from_its_step(
    sim: SimProcess, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    state = tmp_path / "admin.sqlite3"
    async with running(config(sim, state)) as gw:
        await add_new_units(http, gw, sim)
        ask = {"to": "v2", "steps": [20, 100], "step_seconds": 60, "gates": GATES}
        status, started = await admin(http, gw, "POST", "/admin/rollouts", ask)
        assert status == 201 and "note" not in started
        deadline = asyncio.get_running_loop().time() + 10
        while gw.units.canary is None or gw.units.canary.cell != "a":
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
    async with running(config(sim, state)) as gw:
        status, current = await admin(http, gw, "GET", "/admin/rollouts/current")
        assert status == 200 and current["id"] == started["id"]
        assert current["state"] == "running" and current["cell"] == "a" and current["step"] == 0
        canary = gw.units.canary
        assert canary is not None and canary.cell == "a" and canary.share == 0.2
        status, aborted = await admin(http, gw, "POST", "/admin/rollouts/current/abort")
        assert status == 200 and aborted["state"] == "aborted"
        assert gw.units.canary is None
    async with running(config(sim, state)) as gw:  # an ended rollout stays ended
        _, current = await admin(http, gw, "GET", "/admin/rollouts/current")
        _, listed = await admin(http, gw, "GET", "/admin/rollouts")
        assert [r["id"] for r in listed["rollouts"]] == [started["id"]]
        assert gw.units.canary is None


PROCESS_CONFIG = """
[gateway]
port = 0
models = ["{model}"]
workers = {workers}
shutdown_timeout = 5.0
[metrics]
port = 0
[routing]
affinity = "session"
[health]
enabled = false
[breaker]
enabled = false
[admin]
state_file = ""
"""


@contextlib.contextmanager
def gateway_process(
    tmp: Path, sim: SimProcess, name: str = "gw", workers: int = 1, extra: str = ""
) -> Iterator[tuple[subprocess.Popen[bytes], Remote]]:
    """A gateway in a subprocess (`workers` of them behind a control plane), the old and the
    new units in its config file, `extra` TOML tables after the rest; its output in
    `<name>.log`. Stopped with SIGTERM on the way out, unless it is gone already."""
    leaders = {u["id"]: u["leader"] for u in sim.units}
    tables = "".join(
        f'[[units]]\nid = "{i}"\nleader = "{leaders[i]}"\ncell = "{cell}"\nrevision = "{rev}"\n'
        for i, cell, rev in [(i, c, "v1") for i, c in OLD.items()]
        + [(i, c, "v2") for i, c in NEW.items()]
    )
    path = tmp / f"{name}.toml"
    path.write_text(PROCESS_CONFIG.format(model=MODEL, workers=workers) + extra + tables)
    ready = tmp / f"{name}.ready"
    argv = [sys.executable, "-m", "gateway", "gateway", "--config", str(path)]
    with (tmp / f"{name}.log").open("wb") as out:
        proc = subprocess.Popen(
            [*argv, "--ready-file", str(ready)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "gateway did not start"
            time.sleep(0.05)
        found = orjson.loads(ready.read_bytes())
        yield proc, Remote(found["public"], found["metrics"])
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        stop_process(proc, 20.0)


@dataclass
class Remote:
    """A gateway in another process, as the helpers above take one."""

    public_url: str
    metrics_url: str


@pytest.mark.slow  # a control plane and two workers start: about 10 s on a busy machine
async def test_with_workers_the_control_plane_judges_the_workers_answers(
    sim: SimProcess, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    for unit_id in NEW:
        sim.post(f"/units/{unit_id}/settings", {"ttft_ms": 305})
    with gateway_process(tmp_path, sim, workers=2) as (_, gw):
        async with loaded(http, gw) as load:
            ask = {"to": "v2", "steps": [50, 100], "step_seconds": 1.5, "gates": GATES}
            status, started = await admin(http, gw, "POST", "/admin/rollouts", ask)
            assert status == 201, started
            slow = await finished(http, gw, within=30)
            assert slow["state"] == "rolled_back" and "ttft" in slow["reason"], slow
            for unit_id in NEW:
                sim.post(f"/units/{unit_id}/settings", {"ttft_ms": 5})
            status, started = await admin(http, gw, "POST", "/admin/rollouts", ask)
            assert status == 201, started
            good = await finished(http, gw, within=30)
        assert good["state"] == "succeeded", good
        assert load.failed == []
        assert load.served["u1"] > 0 and load.served["u3"] > 0
