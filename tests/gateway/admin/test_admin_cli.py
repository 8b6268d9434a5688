"""`unitgate admin` end to end against a gateway process, and its human-readable output."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.admin import tables
from gateway.base.readyfile import wait_ready_blocking
from tests.support import ROOT, SimProcess, stop_process

TOKEN = "ops-token"


def _config_toml(sim: SimProcess, state: Path) -> str:
    lines = [
        '[gateway]\nport = 0\nmodels = ["unitgate-sim"]\n',
        "[metrics]\nport = 0\n",
        "[health]\nenabled = false\n[breaker]\nenabled = false\n",
        f'[admin]\nstate_file = "{state}"\n',
    ]
    for unit in sim.units:
        nodes = ", ".join(f'"{n}"' for n in unit["nodes"])
        lines.append(
            f'[[units]]\nid = "{unit["id"]}"\nleader = "{unit["leader"]}"\nnodes = [{nodes}]\n'
        )
    return "\n".join(lines)


@pytest.fixture
def ops_url(clean_sim: SimProcess, tmp_path: Path) -> Iterator[str]:
    """A `unitgate gateway` process whose admin token is `ops:ops-token`; its operator URL."""
    cfg = tmp_path / "gw.toml"
    cfg.write_text(_config_toml(clean_sim, tmp_path / "admin.sqlite3"))
    ready = tmp_path / "gw.ready.json"
    command = ["gateway", "--config", str(cfg), "--ready-file", str(ready)]
    env = {**os.environ, "UNITGATE_ADMIN_TOKEN": f"ops:{TOKEN}"}
    proc = subprocess.Popen([sys.executable, "-m", "gateway", *command], cwd=ROOT, env=env)
    try:
        yield str(wait_ready_blocking(ready, proc, 30.0, "the gateway")["metrics"])
    finally:
        stop_process(proc)


def admin(url: str, *args: str, token: str = TOKEN) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "UNITGATE_ADMIN_TOKEN"}
    if token:
        env["MY_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "gateway", "admin", "--url", url, "--token-env", "MY_TOKEN", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def admin_json(url: str, *args: str) -> Any:
    done = admin(url, "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_every_command(ops_url: str, clean_sim: SimProcess) -> None:
    assert [u["id"] for u in admin_json(ops_url, "units")["units"]] == ["u0", "u1", "u2"]
    unit = admin_json(ops_url, "disable", "u0", "--reason", "bad GPU")
    assert (unit["admin"]["state"], unit["admin"]["who"], unit["routable"]) == (
        "disabled",
        "ops",
        False,
    )
    assert admin_json(ops_url, "drain", "u1")["admin"]["state"] == "drained"  # nothing in flight
    assert admin_json(ops_url, "enable", "u1", "--reason", "back")["routable"] is True
    leader = clean_sim.units[2]["leader"]
    added = admin_json(
        ops_url, "add", "--id", "u9", "--leader", leader, "--node", leader, "--weight", "2",
        "--max-inflight", "4",
    )  # fmt: skip
    # Probes are off in this gateway: nothing would ever judge the unit, so it is taken as healthy.
    assert (added["id"], added["cap"], added["weight"], added["routable"]) == ("u9", 4, 2.0, True)
    assert admin_json(ops_url, "unit", "u9")["nodes"][0]["url"] == leader
    assert admin_json(ops_url, "remove", "u9") == {"id": "u9", "removed": True, "in_flight": 0}
    events = admin_json(ops_url, "events", "--unit", "u1", "--limit", "1")["events"]
    assert [(e["what"], e["reason"], e["who"]) for e in events] == [("enable", "back", "ops")]

    table = admin(ops_url, "units")
    assert table.returncode == 0
    assert table.stdout.splitlines()[0].split()[:3] == ["ID", "ROUTABLE", "HEALTH"]
    assert "admin disabled: bad GPU" in table.stdout
    detail = admin(ops_url, "unit", "u0").stdout
    assert "unit u0: NOT routable" in detail and "disabled by ops" in detail
    log = admin(ops_url, "events").stdout
    assert "disable" in log and "bad GPU" in log and "u9" in log


@pytest.mark.slow
def test_errors_are_one_line_with_an_exit_code(ops_url: str) -> None:
    wrong = admin(ops_url, "units", token="nope")
    assert wrong.returncode == 1
    assert wrong.stderr.strip().startswith("unitgate admin: 403")
    assert "the token is not valid" in wrong.stderr and "MY_TOKEN" in wrong.stderr
    missing = admin(ops_url, "units", token="")
    assert missing.returncode == 1 and "401" in missing.stderr and "set MY_TOKEN" in missing.stderr
    unknown = admin(ops_url, "disable", "nope", "--reason", "x")
    assert unknown.returncode == 1 and "404 Not Found: unknown unit 'nope'" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
    assert admin(ops_url, "disable", "u0").returncode == 2  # --reason is required


def test_unreachable_gateway_exits_3() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = admin(f"http://127.0.0.1:{port}", "units")
    assert done.returncode == 3
    assert done.stderr.startswith(f"unitgate admin: cannot reach http://127.0.0.1:{port}")
    assert "refused" in done.stderr.lower()


def _unit(uid: str, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": uid,
        "routable": True,
        "health": {"healthy": True, "reason": ""},
        "breaker": {"state": "admitting"},
        "admin": {"state": "enabled", "reason": "", "who": "config", "since": 0.0},
        "in_flight": 0,
        "cap": 8,
    }
    return {**base, **over}


def test_units_table_says_why_a_unit_is_out() -> None:
    payload = {
        "units": [
            _unit("u0"),
            _unit("u1", routable=False, health={"healthy": False, "reason": "node 1 down"}),
            _unit(
                "u2",
                routable=False,
                admin={"state": "draining", "reason": "move", "who": "a", "since": 0.0},
                in_flight=3,
            ),
            _unit("u3", routable=False, breaker={"state": "ejected", "reason": "5 failures"}),
        ]
    }
    lines = tables.units(payload).splitlines()
    assert lines[0].split() == [
        "ID", "ROUTABLE", "HEALTH", "BREAKER", "ADMIN", "IN-FLIGHT", "CAP", "WHY", "NOT",
    ]  # fmt: skip
    assert lines[1].split() == ["u0", "yes", "healthy", "admitting", "enabled", "0", "8"]
    assert lines[2].endswith("unhealthy: node 1 down")
    assert lines[3].endswith("admin draining: move")
    assert lines[4].endswith("breaker ejected: 5 failures")
    assert lines[1].index("enabled") == lines[0].index("ADMIN")  # columns line up
