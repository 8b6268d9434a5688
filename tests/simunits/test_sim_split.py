"""One unit across several simulator processes (`--nodes`), so a single node can be killed."""

from __future__ import annotations

import resource
from pathlib import Path

import aiohttp
import pytest

from loadtest.simunits import SimCluster
from loadtest.simunits.cli import main
from loadtest.simunits.topology import ConfigError, parse_served, units_from_config
from tests.simunits.split import planned_units, start_part, units_toml
from tests.support import stop_process


def two_units() -> dict[str, object]:
    a, b = planned_units([2, 2])
    return {"units": [{**a, "id": "a"}, {**b, "id": "b"}]}


@pytest.mark.parametrize(
    ("text", "message"),
    [("a", "not unit:rank"), ("a:x", "not unit:rank"), ("c:0", "unknown unit"), ("a:2", "no rank")],
)
def test_bad_node_lists_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_served(text, units_from_config(two_units()))


def test_node_list_parses() -> None:
    specs = units_from_config(two_units())
    assert parse_served("a:1, b:0,a:1", specs) == {("a", 1), ("b", 0)}


def test_nodes_needs_a_config() -> None:
    with pytest.raises(SystemExit) as info:
        main(["--nodes", "u0:1"])
    assert info.value.code == 2


async def _health(session: aiohttp.ClientSession, url: str) -> dict[str, object]:
    async with session.get(url + "/health") as resp:
        result: dict[str, object] = await resp.json()
        return result


async def test_each_process_serves_only_its_nodes(session: aiohttp.ClientSession) -> None:
    specs = units_from_config(two_units())
    a = specs[0]
    leaders = SimCluster(specs=specs, serve={("a", 0), ("b", 0), ("b", 1)})
    follower = SimCluster(specs=specs, serve={("a", 1)})
    async with leaders, follower:
        assert [u.id for u in follower.units] == ["a"]  # b has no node here: not run at all
        described = follower.describe()["units"]
        assert described == [
            {"id": "a", "leader": a.leader.url(), "nodes": [n.url() for n in a.nodes], "ranks": [1]}
        ]
        assert (await _health(session, a.nodes[1].url()))["rank"] == 1
        assert (await _health(session, a.nodes[0].url()))["role"] == "leader"
        async with session.post(a.leader.url() + "/v1/completions", json={"prompt": "x"}) as resp:
            assert resp.status == 200
    with pytest.raises(aiohttp.ClientConnectionError):
        await _health(session, a.nodes[1].url())


@pytest.mark.slow
def test_a_follower_process_dies_alone(tmp_path: Path) -> None:
    config = tmp_path / "units.toml"
    config.write_text(units_toml(planned_units([2, 2])))
    main_sim = start_part(tmp_path, "main", config, "u0:0,u1:0,u1:1")
    try:
        lone = start_part(tmp_path, "lone", config, "u0:1")
        try:
            assert [u["ranks"] for u in lone.units] == [[1]]
            limits = Path(f"/proc/{lone.proc.pid}/limits")
            if limits.exists():  # Linux: the fd limit was raised to the hard limit
                hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
                row = next(r for r in limits.read_text().splitlines() if "open files" in r)
                assert row.split()[3] == str(hard)
            lone.proc.kill()
            lone.proc.wait(5)
            assert main_sim.get("/units/u0")["ranks"] == [0]
        finally:
            stop_process(lone.proc)
    finally:
        stop_process(main_sim.proc)
