"""The `unitgate` kind: every node answers the node contract itself.

`GET /health` returns a JSON object with `status`, `unit`, `rank`, `role`, `pid` and, on the
leader, the engine's `step`, `pending`, `kv_slots_used` and `kv_slots_total` (their ratio is
the KV-cache share the admin view and the status page show), and optionally `progress`: a
count that moves while the engine computes, inside a step too, which the stall rule then
watches instead of `step` (the builtin engine's: layers run). The builtin engine's nodes serve
it, and so does `unitgate watch` for a process that runs no HTTP server (the followers of
every kind). The verdict checks the identity it reports against the config.
"""

from __future__ import annotations

import ssl
from typing import Any

import orjson

from gateway.config import UnitConfig
from gateway.health.probe import ProbeFailed, Target, get
from gateway.health.result import NodeReport
from gateway.upstream.pool import ConnectionPool


class ContractProbe:
    __slots__ = ("target",)

    def __init__(self, target: Target) -> None:
        self.target = target

    async def __call__(self, pool: ConnectionPool, within: float) -> NodeReport:
        return await probe_node(pool, self.target, within)


def leader_probe(
    unit: UnitConfig, extra: bytes, tls: ssl.SSLContext | None = None
) -> ContractProbe:
    return ContractProbe(Target(unit.nodes[0], "/health", extra, tls=tls))


async def probe_node(pool: ConnectionPool, target: Target, within: float) -> NodeReport:
    """`within` seconds bound the whole probe, connecting included."""
    try:
        status, body, latency_ms = await get(pool, target, within)
    except ProbeFailed as failed:
        return failed.report
    return parse_health(status, body, latency_ms)


def parse_health(status: int, body: bytes, latency_ms: float) -> NodeReport:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        return NodeReport(latency_ms, f"HTTP {status} without a JSON object body")
    said = _text(doc, "status")
    error = None
    if status != 200:
        error = f"HTTP {status}" + (f" (status {said})" if said else "")
    return NodeReport(
        latency_ms,
        error,
        said,
        _text(doc, "unit"),
        _text(doc, "role"),
        _int(doc, "rank"),
        _int(doc, "pid"),
        _int(doc, "step"),
        _int(doc, "pending"),
        _int(doc, "kv_slots_used"),
        kv_usage=_share(_int(doc, "kv_slots_used"), _int(doc, "kv_slots_total")),
        progress=_int(doc, "progress"),
        tied=doc.get("tied_requests") is True,
    )


def _share(used: int | None, total: int | None) -> float | None:
    """The KV cache's share in use, when the leader reports both counts."""
    if used is None or not total or total < 0:
        return None
    return min(max(used / total, 0.0), 1.0)


def _text(doc: dict[str, Any], key: str) -> str | None:
    value = doc.get(key)
    return value if isinstance(value, str) else None


def _int(doc: dict[str, Any], key: str) -> int | None:
    value = doc.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None
