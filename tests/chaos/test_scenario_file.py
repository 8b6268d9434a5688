"""loadtest/scenarios/chaos.toml stays loadable and aimed at the demo cluster of config.toml."""

from __future__ import annotations

import tomllib

import pytest

from loadtest.gen.scenario import AdminAction, SignalAction, load_scenario
from tests.support import ROOT

pytestmark = pytest.mark.chaos


def test_chaos_scenario_targets_the_make_run_cluster() -> None:
    actions = load_scenario(ROOT / "loadtest" / "scenarios" / "chaos.toml")
    config = tomllib.loads((ROOT / "config.toml").read_text())
    nodes = {url: unit["id"] for unit in config["units"] for url in unit["nodes"]}
    admin_url = f"http://{config['metrics']['host']}:{config['metrics']['port']}"
    kinds = set()
    for action in actions:
        kind = action.kind
        if isinstance(kind, SignalAction):
            assert kind.health_url in nodes, f"{action.describe()}: not a node of config.toml"
            kinds.add(f"signal {kind.name}")
        else:
            assert isinstance(kind, AdminAction)
            assert kind.unit in nodes.values() and kind.admin_url == admin_url
            kinds.add(f"admin {kind.action}")
    assert {"admin drain", "admin enable", "signal kill"} <= kinds
    assert [a.at for a in actions] == sorted(a.at for a in actions)
