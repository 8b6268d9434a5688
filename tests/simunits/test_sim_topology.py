"""Topology: gateway config parsing and the address each node listens on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.base.ports import free_port
from loadtest.simunits import SimCluster
from loadtest.simunits.cli import main
from loadtest.simunits.topology import ConfigError, units_from_config


def test_config_nodes_default_to_the_leader() -> None:
    doc: dict[str, Any] = {
        "gateway": {"port": 1},
        "units": [{"id": "a", "leader": "http://127.0.0.1:9001", "weight": 3}],
    }
    (spec,) = units_from_config(doc)
    assert spec.leader_shares_rank0 and len(spec.nodes) == 1
    assert spec.nodes[0].url() == "http://127.0.0.1:9001"


@pytest.mark.parametrize(
    ("units", "message"),
    [
        ([], "no [[units]]"),
        ([{"id": "a", "leader": "http://h"}], "no port"),
        ([{"id": "a", "leader": "https://h:1"}], "not an http"),
        ([{"leader": "http://h:1"}], "units[0].id"),
        ([{"id": "a", "leader": "http://h:1"}, {"id": "a", "leader": "http://h:2"}], "twice"),
        ([{"id": "a", "leader": "http://h:1"}, {"id": "b", "leader": "http://h:1"}], "two"),
        ([{"id": "a", "leader": "http://h:1", "nodes": ["http://h:2", "http://h:1"]}], "nodes[0]"),
        ([{"id": "a", "leader": "http://h:1", "nodes": []}], "non-empty"),
    ],
)
def test_bad_configs_name_the_problem(units: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        units_from_config({"units": units})


async def test_config_addresses_are_used(session: aiohttp.ClientSession) -> None:
    leader, rank0, rank1 = (f"http://127.0.0.1:{free_port()}" for _ in range(3))
    doc = {"units": [{"id": "x", "leader": leader, "nodes": [rank0, rank1]}]}
    async with SimCluster(specs=units_from_config(doc)) as cluster:
        (unit,) = cluster.units
        assert (unit.leader_url, unit.node_urls) == (leader, [rank0, rank1])
        async with session.get(leader + "/v1/models") as resp:
            assert resp.status == 200
        for url, rank in ((leader, 0), (rank0, 0), (rank1, 1)):
            async with session.get(url + "/health") as resp:
                assert (await resp.json())["rank"] == rank
        async with session.get(rank1 + "/v1/models") as resp:
            assert resp.status == 404  # followers do not serve the API


def test_cli_rejects_mixed_or_bad_topology(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[units]]\nid = "a"\nleader = "http://127.0.0.1"\n')
    for argv in (["--from-config", str(bad)], ["--from-config", str(bad), "--units", "1"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
