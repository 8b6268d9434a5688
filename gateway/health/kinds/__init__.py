"""Unit kinds: how the prober reads the nodes of each kind of server it fronts.

A kind is one module with a `leader_probe`: an async callable `(pool, within) -> NodeReport`
that yields the report the verdict already reads (health/result.py), so gang health,
hysteresis, stall detection and engine-load routing work the same for every kind. Followers
answer the node contract whatever the kind: the builtin engine's do it themselves, a stock
server's through `unitgate watch`.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from gateway.config import UnitConfig
from gateway.health.kinds import openai, unitgate, vllm
from gateway.health.probe import Target
from gateway.health.result import NodeReport
from gateway.proxy.pool import ConnectionPool
from gateway.tls import unit_context


class NodeProbe(Protocol):
    def __call__(self, pool: ConnectionPool, within: float) -> Awaitable[NodeReport]: ...


def node_probes(unit: UnitConfig, public: tuple[str, ...]) -> list[NodeProbe]:
    """One probe per node, rank order; `public` is the model ids the unit serves."""
    extra = unit.header_lines()
    tls = unit_context(unit)
    leader: NodeProbe
    if unit.kind == "vllm":
        leader = vllm.leader_probe(unit, extra, tls)
    elif unit.kind == "openai":
        leader = openai.leader_probe(unit, extra, public, tls)
    else:
        leader = unitgate.leader_probe(unit, extra, tls)
    followers = [
        unitgate.ContractProbe(Target(url, "/health", extra, tls=tls)) for url in unit.nodes[1:]
    ]
    return [leader, *followers]
