"""Unit kinds: how the prober reads the nodes of each kind of server it fronts.

A kind is one module with a `leader_probe`: an async callable `(pool, within) -> NodeReport`
that yields the report the verdict already reads (health/result.py), so gang health,
hysteresis, stall detection and engine-load routing work the same for every kind. A kind whose
leader reports its own engine's work (`busy_at`) says for how long that report vouches for it
(`report_window`). Followers answer the node contract whatever the kind: the builtin engine's
do it themselves, a stock server's through `unitgate watch`.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from gateway.config import UnitConfig
from gateway.health.kinds import openai, unitgate, vllm
from gateway.health.probe import Target
from gateway.health.result import NodeReport
from gateway.tls import unit_context
from gateway.upstream.pool import ConnectionPool


class NodeProbe(Protocol):
    def __call__(self, pool: ConnectionPool, within: float) -> Awaitable[NodeReport]: ...


def report_window(unit: UnitConfig) -> float:
    """How long (seconds since it was read) the leader's own report of work moving
    (`NodeReport.busy_at`) vouches for it while its probes time out; 0 for a kind that reports
    none."""
    return vllm.report_window(unit) if unit.kind == "vllm" else 0.0


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
