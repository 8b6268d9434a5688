"""The `openai` kind: any OpenAI-compatible server (SGLang, llama.cpp, TGI, a hosted endpoint).

Alive means `GET /v1/models` answers 200 and lists a model the unit serves (its
`served_model`, else the public ids it serves), or, with `health_path` set, that path answers
200. Such a server reports no load and no progress: the gateway balances on its own counts,
and live traffic, the breaker and the canary catch what a 200 cannot.
"""

from __future__ import annotations

import ssl

import orjson

from gateway.config import UnitConfig
from gateway.health.probe import ProbeFailed, Target, get
from gateway.health.result import NodeReport
from gateway.upstream.pool import ConnectionPool


class OpenAIProbe:
    __slots__ = ("health_path", "names", "target", "unit_id")

    def __init__(self, unit_id: str, target: Target, names: frozenset[str] | None) -> None:
        """`names`: the model ids of which /v1/models must list one; None: any 200 will do."""
        self.unit_id, self.target, self.names = unit_id, target, names

    async def __call__(self, pool: ConnectionPool, within: float) -> NodeReport:
        try:
            status, body, latency_ms = await get(pool, self.target, within)
        except ProbeFailed as failed:
            return failed.report
        problem = f"HTTP {status} from {self.target.path}" if status != 200 else None
        if problem is None and self.names is not None:
            problem = missing_model(body, self.names)
        if problem is not None:
            return NodeReport(latency_ms, problem)
        return NodeReport(latency_ms, None, "ok", self.unit_id, "leader", 0)


def leader_probe(
    unit: UnitConfig, extra: bytes, public: tuple[str, ...], tls: ssl.SSLContext | None = None
) -> OpenAIProbe:
    if unit.health_path:
        return OpenAIProbe(unit.id, Target(unit.nodes[0], unit.health_path, extra, tls=tls), None)
    names = frozenset((unit.served_model,) if unit.served_model else public)
    return OpenAIProbe(unit.id, Target(unit.nodes[0], "/v1/models", extra, tls=tls), names)


def missing_model(body: bytes, names: frozenset[str]) -> str | None:
    """Why a /v1/models answer does not show the unit's model, or None when it does."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "/v1/models answered 200 without JSON"
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return "/v1/models answered 200 without a `data` list"
    listed = {m.get("id") for m in data if isinstance(m, dict)}
    if listed & names:
        return None
    shown = sorted(str(m) for m in listed)[:5]
    return f"/v1/models lists {shown}, not {sorted(names)}"
