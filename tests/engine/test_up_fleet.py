"""`unitgate up --replicas N` without a fleet running: where the replicas listen, what config
each runs, and every refusal before anything starts (flags, ports, redis-server, workers)."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.base.ports import is_free
from gateway.config import Config, config_from_dict
from gateway.launcher.cli import main as unitgate
from gateway.launcher.up.backoff import Backoff
from gateway.launcher.up.fleet import ReplicaPorts, replica_config, replica_ports, runs_store
from gateway.launcher.up.main import UpOptions, run_up
from gateway.launcher.up.plan import PlanError, plan_units
from gateway.launcher.up.ports import check_free
from gateway.launcher.up.ready import wait_fleet
from gateway.launcher.up.replicas import ReplicaLauncher, ReplicaSupervisor
from gateway.server import running
from tests.support import ROOT


def config(**sections: dict[str, Any]) -> Config:
    raw: dict[str, Any] = {
        "gateway": {"models": ["m"]},
        "units": [
            {"id": "u0", "leader": "http://127.0.0.1:8101", "nodes": ["http://127.0.0.1:8100"]},
            {"id": "u1", "leader": "http://127.0.0.1:8083", "nodes": ["http://127.0.0.1:8083"]},
        ],
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return config_from_dict(raw)


def ports(cfg: Config, count: int) -> list[tuple[int, int]]:
    return [(r.public, r.metrics) for r in replica_ports(cfg, plan_units(cfg), count)]


def test_replicas_take_the_next_ports_no_other_listener_of_the_run_holds() -> None:
    """The default 8080/8081: "port + i" would give replica 1 the public port 8081, replica 0's
    operator port; u1's node holds 8083, so replica 1's operator port skips it."""
    assert ports(config(), 3) == [(8080, 8081), (8082, 8084), (8085, 8086)]
    assert ports(config(), 1) == [(8080, 8081)]
    far = config(gateway={"port": 9000}, metrics={"port": 9100})
    assert ports(far, 2) == [(9000, 9100), (9001, 9101)]


def test_port_zero_gives_every_replica_its_own_os_assigned_port() -> None:
    assert ports(config(gateway={"port": 0}, metrics={"port": 0}), 3) == [(0, 0)] * 3


def test_no_replica_is_laid_out_past_the_last_port() -> None:
    with pytest.raises(PlanError, match=r"replica 1: no port left above \[gateway\].port"):
        ports(config(gateway={"port": 65535}, metrics={"port": 9100}), 2)


def test_a_replica_shares_state_through_the_store_up_runs_without_credentials() -> None:
    cfg = config(state={"password_file": "/secret", "username": "ops", "key_prefix": "demo"})
    mine = replica_config(cfg, ReplicaPorts(1, 8082, 8084), "unix:///tmp/r/redis.sock")
    assert (mine.gateway.port, mine.metrics.port) == (8082, 8084)
    assert (mine.state.backend, mine.state.url) == ("redis", "unix:///tmp/r/redis.sock")
    assert (mine.state.username, mine.state.password_file, mine.state.password_env) == ("", "", "")
    assert mine.state.key_prefix == "demo"
    assert mine.units == cfg.units and mine.health == cfg.health


def test_a_configured_store_is_used_as_it_is_and_up_starts_none() -> None:
    theirs = config(state={"backend": "redis", "url": "redis://10.0.0.5:6379/2", "replica": "gw"})
    assert not runs_store(theirs, 2)
    mine = replica_config(theirs, ReplicaPorts(2, 0, 0), None)
    assert (mine.state.backend, mine.state.url) == ("redis", "redis://10.0.0.5:6379/2")
    assert mine.state.replica == "gw-2"  # one name per replica, or their reports would clash
    assert runs_store(config(), 2) and not runs_store(config(), 1)
    assert not runs_store(config(admin={"enabled": False}), 2)  # no admin state to share


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_taken_port_is_found_before_anything_starts(held_port: int) -> None:
    assert not is_free("127.0.0.1", held_port)
    cfg = config(gateway={"port": 0}, metrics={"port": 0})
    check_free(cfg, [ReplicaPorts(0, 0, 0), ReplicaPorts(1, 0, 0)])  # the OS picks them
    taken = [ReplicaPorts(0, 0, 0), ReplicaPorts(1, 0, held_port)]
    with pytest.raises(PlanError, match=rf"replica 1's operator .* port 127.0.0.1:{held_port}"):
        check_free(cfg, taken)


def test_up_refuses_a_taken_replica_port_with_exit_2(
    held_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config(gateway={"port": held_port}, metrics={"port": 0})
    options = UpOptions(tmp_path, 2, simulated=True, config_path=tmp_path / "config.toml")
    assert run_up(cfg, options) == 2
    assert f"replica 0's public port 127.0.0.1:{held_port} is taken" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_replicas_must_be_a_positive_integer(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        unitgate(["up", "--simulated", "--replicas", value])
    assert exit_.value.code == 2
    assert "argument --replicas: must be an integer >= 1" in capsys.readouterr().err


def test_without_redis_server_up_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a real PATH holding no redis-server
    options = UpOptions(tmp_path, 2, simulated=True, config_path=tmp_path / "config.toml")
    assert run_up(config(gateway={"port": 0}, metrics={"port": 0}), options) == 2
    err = capsys.readouterr().err
    assert "redis-server" in err and "apt-get install redis-server" in err


def test_replicas_with_workers_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    options = UpOptions(replicas=2, simulated=True, config_path=Path("config.toml"))
    assert run_up(config(gateway={"workers": 2}), options) == 2
    assert "[gateway].workers = 2" in capsys.readouterr().err


async def test_a_replica_that_exits_before_it_is_ready_fails_the_wait_with_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real `unitgate replica` process, given a config file that is not there: it exits 2
    at once, and `up` names it and shows its log's last lines rather than waiting 180 s."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    launcher = ReplicaLauncher(tmp_path / "gone.toml", tmp_path, env, "info", 30.0, None)
    replica = ReplicaSupervisor(ReplicaPorts(1, 0, 0), launcher, Backoff(), grace=5.0)
    task = asyncio.create_task(replica.run())
    cfg = config(gateway={"port": 0}, metrics={"port": 0}, admin={"enabled": False})
    async with running(cfg) as gateway:
        code = await asyncio.wait_for(
            wait_fleet(gateway, [replica], plan_units(cfg), asyncio.Event(), 30.0, tmp_path), 30
        )
    await asyncio.wait_for(task, 10)  # no restart: it never was ready
    assert code == 1 and replica.first_ready.result() == 2
    out = capsys.readouterr().out
    assert "replica 1 exited with 2 before it was ready" in out
    assert "config file not found" in out and str(tmp_path / "replica-1.log") in out
