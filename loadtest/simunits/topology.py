"""Which simulated units to run and where each node listens (simulated units test tool).

Reading the gateway's own config lets a test run the gateway and the simulated units
from one file, so the two can never disagree about addresses.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.base.net import http_address


class ConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class UnitSpec:
    id: str
    leader: Address
    nodes: tuple[Address, ...]

    @property
    def leader_shares_rank0(self) -> bool:
        """Whether the OpenAI API and rank 0's /health are served by one listener."""
        return self.leader == self.nodes[0]


def parse_url(url: object, where: str) -> Address:
    if not isinstance(url, str):
        raise ConfigError(f"{where}: must be a URL string")
    try:
        host, port = http_address(url)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    if port is None:
        raise ConfigError(f"{where}: {url!r} has no port")
    return Address(host, port)


def _unit_from_table(table: object, index: int) -> UnitSpec:
    where = f"units[{index}]"
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: must be a table")
    unit_id = table.get("id")
    if not isinstance(unit_id, str) or not unit_id:
        raise ConfigError(f"{where}.id: must be a non-empty string")
    leader = parse_url(table.get("leader"), f"{where}.leader")
    raw_nodes = table.get("nodes")
    if raw_nodes is None:
        return UnitSpec(unit_id, leader, (leader,))
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ConfigError(f"{where}.nodes: must be a non-empty list of URLs")
    nodes = tuple(parse_url(u, f"{where}.nodes[{r}]") for r, u in enumerate(raw_nodes))
    if leader in nodes[1:]:
        raise ConfigError(f"{where}.leader: may only share an address with nodes[0]")
    return UnitSpec(unit_id, leader, nodes)


def _check_distinct(specs: Sequence[UnitSpec]) -> None:
    ids: set[str] = set()
    seen: set[Address] = set()
    for spec in specs:
        if spec.id in ids:
            raise ConfigError(f"unit id {spec.id!r} appears twice")
        ids.add(spec.id)
        listeners = [*spec.nodes, *([] if spec.leader_shares_rank0 else [spec.leader])]
        for address in listeners:
            if address.port != 0 and address in seen:
                raise ConfigError(f"address {address.url()} is given to two listeners")
            seen.add(address)


def units_from_config(doc: Mapping[str, object]) -> list[UnitSpec]:
    tables = doc.get("units")
    if not isinstance(tables, list) or not tables:
        raise ConfigError("config has no [[units]]")
    specs = [_unit_from_table(t, i) for i, t in enumerate(tables)]
    _check_distinct(specs)
    return specs


def load_config(path: Path) -> list[UnitSpec]:
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return units_from_config(doc)


def generated_units(units: int, followers: int, host: str) -> list[UnitSpec]:
    """Units whose nodes all take OS-assigned ports, so parallel test runs never collide."""
    anywhere = Address(host, 0)
    return [UnitSpec(f"u{i}", anywhere, (anywhere,) * (followers + 1)) for i in range(units)]


def parse_served(text: str, specs: Sequence[UnitSpec]) -> frozenset[tuple[str, int]]:
    """`u0:1,u1:0` -> {("u0", 1), ("u1", 0)}: the nodes one simulator process serves."""
    ranks = {spec.id: len(spec.nodes) for spec in specs}
    served: set[tuple[str, int]] = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        unit_id, sep, rank_text = item.rpartition(":")
        if not sep or not rank_text.isdigit():
            raise ConfigError(f"--nodes: {item!r} is not unit:rank")
        if unit_id not in ranks:
            raise ConfigError(f"--nodes: unknown unit {unit_id!r}")
        rank = int(rank_text)
        if rank >= ranks[unit_id]:
            raise ConfigError(f"--nodes: unit {unit_id!r} has no rank {rank}")
        served.add((unit_id, rank))
    if not served:
        raise ConfigError("--nodes: lists no node")
    return frozenset(served)
