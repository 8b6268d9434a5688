"""`unitgate up --simulated` without processes: the simulator is handed the units as the
gateway loaded them (an environment override of a unit's address moves the simulated unit
too), every unit of the config is simulated whatever its kind, and what the simulator would
refuse is refused by `up` first, naming the unit."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from gateway.config import config_from_dict, load_config
from gateway.launcher.up.fleet import ReplicaPorts
from gateway.launcher.up.main import UpOptions, run_up
from gateway.launcher.up.plan import PlanError, plan_simulated
from gateway.launcher.up.replica import _parser as replica_parser
from gateway.launcher.up.replicas import ReplicaLauncher
from gateway.launcher.up.simulated import units_toml
from loadtest.simunits.topology import units_from_config

FILE = """
[gateway]
models = ["m"]

[[units]]
id = "u0"
leader = "http://127.0.0.1:8100"
nodes = ["http://127.0.0.1:8102", "http://127.0.0.1:8103"]

[[units]]
id = "u1"
leader = "http://127.0.0.1:8200"
"""


def test_the_simulator_reads_the_units_with_their_overrides(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(FILE, encoding="utf-8")
    environ = {
        "UNITGATE__UNITS__1__LEADER": "http://127.0.0.1:9200",
        "UNITGATE__UNITS__2": '{id = "u2", leader = "http://127.0.0.1:9300"}',
    }
    config = load_config(path, environ)
    specs = units_from_config(tomllib.loads(units_toml(config.units)))
    assert [(s.id, s.leader.url(), [n.url() for n in s.nodes]) for s in specs] == [
        ("u0", "http://127.0.0.1:8100", ["http://127.0.0.1:8102", "http://127.0.0.1:8103"]),
        ("u1", "http://127.0.0.1:9200", ["http://127.0.0.1:9200"]),
        ("u2", "http://127.0.0.1:9300", ["http://127.0.0.1:9300"]),
    ]


def config(*units: dict[str, Any]) -> Any:
    return config_from_dict({"gateway": {"models": ["m"]}, "units": list(units)})


def test_every_unit_is_simulated_and_ready_waits_for_those_of_its_own_kind() -> None:
    """Units `up` would not run (stock servers, addresses elsewhere) are simulated all the same,
    as the simulator serves the whole config; ready waits for the node contract's units only."""
    plan = plan_simulated(
        config(
            {"id": "u0", "leader": "http://127.0.0.1:8101", "nodes": ["http://127.0.0.1:8100"]},
            {"id": "v0", "kind": "vllm", "leader": "http://127.0.0.1:8300"},
            {"id": "o0", "kind": "openai", "leader": "http://localhost:8400"},
            {"id": "far", "leader": "http://10.0.0.7:9000"},
        )
    )
    assert [u.unit for u in plan.units] == ["u0", "v0", "o0", "far"] and plan.skipped == ()
    assert [u.unit for u in plan.awaited] == ["u0", "far"]
    u0 = plan.units[0].leader
    assert (u0.port, u0.health_port, u0.health_url) == (8101, 8100, "http://127.0.0.1:8100/health")
    assert plan.units[2].leader.health_url == "http://localhost:8400/health"


def test_rank_0_is_probed_where_nodes_0_is_and_an_ipv6_host_is_bracketed() -> None:
    plan = plan_simulated(
        config(
            {"id": "u0", "leader": "http://[::1]:8101", "nodes": ["http://[::1]:8100"]},
            {"id": "u1", "leader": "http://127.0.0.1:8200", "nodes": ["http://localhost:8200"]},
        )
    )
    assert plan.units[0].leader.health_url == "http://[::1]:8100/health"
    u1 = plan.units[1].leader
    assert (u1.health_url, u1.ports) == ("http://localhost:8200/health", (8200, 8200))


@pytest.mark.parametrize(
    ("units", "message"),
    [
        (
            [{"id": "u0", "leader": "https://127.0.0.1:8100"}],
            r"unit u0: a simulated node is served at http://HOST:PORT .*'https://127.0.0.1:8100'",
        ),
        (
            [{"id": "u0", "leader": "http://127.0.0.1"}],
            r"unit u0: a simulated node is served at http://HOST:PORT",
        ),
        (
            [
                {"id": "u0", "leader": "http://127.0.0.1:8100"},
                {"id": "u1", "leader": "http://127.0.0.1:8101", "nodes": ["http://127.0.0.1:8100"]},
            ],
            r"http://127.0.0.1:8100: given to two simulated listeners, unit u0 nodes\[0\] and "
            r"unit u1 nodes\[0\]",
        ),
        (
            [
                {
                    "id": "u0",
                    "leader": "http://127.0.0.1:8101",
                    "nodes": ["http://127.0.0.1:8100", "http://127.0.0.1:8101"],
                }
            ],
            r"given to two simulated listeners, unit u0 nodes\[1\] and unit u0 leader",
        ),
    ],
)
def test_what_the_simulator_would_refuse_is_refused_first(
    units: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(PlanError, match=message):
        plan_simulated(config(*units))


def test_up_refuses_it_with_exit_2_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = config({"id": "u0", "leader": "https://127.0.0.1:8100"})
    assert run_up(bad, UpOptions(tmp_path / "logs", simulated=True)) == 2
    assert "unitgate up: unit u0: a simulated node" in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()


def test_child_replicas_plan_the_units_as_simulated_too() -> None:
    launcher = ReplicaLauncher(Path("up.toml"), Path("logs"), {}, "info", 30.0, None, "text", True)
    argv = launcher.argv(ReplicaPorts(1, 9000, 9001))
    assert replica_parser().parse_args(argv[argv.index("replica") + 1 :]).simulated
    plain = ReplicaLauncher(Path("up.toml"), Path("logs"), {}, "info", 30.0, None)
    assert "--simulated" not in plain.argv(ReplicaPorts(1, 9000, 9001))


def test_workers_are_refused_with_the_way_to_run_them_beside_simulated_units(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`up` hosts one gateway process (the old one-replica path ran workers; it is gone)."""
    cfg = config_from_dict(
        {
            "gateway": {"models": ["m"], "workers": 2},
            "units": [{"id": "u0", "leader": "http://127.0.0.1:8100"}],
        }
    )
    assert run_up(cfg, UpOptions(simulated=True)) == 2
    err = capsys.readouterr().err
    assert "[gateway].workers = 2" in err and "unitgate sim --from-config FILE" in err
