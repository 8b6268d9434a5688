"""A node's /metrics: its health report as Prometheus text, under vLLM's metric names.

A gateway (or Prometheus) reads a builtin node as it reads a stock vLLM server: the prefix
cache's counters (`vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`, in
prompt tokens), the share of KV blocks in use, and the requests running and waiting. A
follower has no scheduler: it reports the load the leader's step messages carry, and no
prefix cache counters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (the health report's field, metric name, type, help)
_FAMILIES = (
    (
        "prefix_cache_queries",
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
    ),
    (
        "prefix_cache_hits",
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prompt tokens found in the prefix cache.",
    ),
    (
        "kv_cache_usage",
        "vllm:kv_cache_usage_perc",
        "gauge",
        "The share of KV cache blocks running sequences hold (0 to 1).",
    ),
    (
        "kv_slots_used",
        "vllm:num_requests_running",
        "gauge",
        "Sequences running (holding a KV slot).",
    ),
    ("waiting", "vllm:num_requests_waiting", "gauge", "Sequences waiting for a slot."),
    ("step", "unitgate_node_steps_total", "counter", "Engine steps this node ran."),
)


def render(report: Mapping[str, Any]) -> str:
    """The report's numbers as Prometheus text; `up` is 1 while the node is healthy."""
    fields = dict(report)
    if "pending" in fields and "kv_slots_used" in fields:
        fields["waiting"] = max(0, int(fields["pending"]) - int(fields["kv_slots_used"]))
    labels = f'unit="{_escape(str(fields.get("unit", "")))}",rank="{fields.get("rank", "")}"'
    lines = [
        "# HELP unitgate_node_up 1 while the node is healthy.",
        "# TYPE unitgate_node_up gauge",
        f"unitgate_node_up{{{labels}}} {int(fields.get('status') == 'ok')}",
    ]
    for field, name, kind, text in _FAMILIES:
        value = fields.get(field)
        if value is None:
            continue
        family = name.removesuffix("_total") if kind == "counter" else name
        lines += [
            f"# HELP {family} {text}",
            f"# TYPE {family} {kind}",
            f"{name}{{{labels}}} {value}",
        ]
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
