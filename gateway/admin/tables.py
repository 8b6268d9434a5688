"""Human-readable output of `unitgate admin`: aligned tables and one-line summaries.

`--json` prints the API's answer verbatim for scripts; this is for an operator at a terminal,
so each unit row leads with why it is not routable, if it is not.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in header], *[[_cell(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def units(payload: dict[str, Any]) -> str:
    header = ("ID", "ROUTABLE", "HEALTH", "BREAKER", "ADMIN", "IN-FLIGHT", "CAP", "WHY NOT")
    rows = [
        (
            u["id"],
            u["routable"],
            "healthy" if u["health"]["healthy"] else "unhealthy",
            u["breaker"].get("state", "?"),
            u["admin"]["state"],
            u["in_flight"],
            u["cap"],
            why_not(u),
        )
        for u in payload["units"]
    ]
    return table(header, rows)


def unit(u: dict[str, Any]) -> str:
    admin = u["admin"]
    lines = [
        f"unit {u['id']}: {'routable' if u['routable'] else 'NOT routable'}",
        f"  health:    {'healthy' if u['health']['healthy'] else 'unhealthy'}"
        + _why(u["health"]["reason"]),
        f"  breaker:   {u['breaker'].get('state', '?')}" + _why(u["breaker"].get("reason")),
        f"  admin:     {admin['state']} by {admin['who']} since {when(admin['since'])}"
        + _why(admin["reason"]),
        f"  in flight: {u['in_flight']} (cap {u['cap']}), drained: {_cell(u['drained'])}",
        f"  leader:    {u['leader']}  weight {u['weight']:g}  models {', '.join(u['models'])}",
        f"  cell:      {u.get('cell', '-')}  revision {u.get('revision') or '-'}"
        + _why(u.get("idle")),
        "",
    ]
    header = ("RANK", "ROLE", "URL", "HEALTHY", "LATENCY-MS", "ERROR")
    nodes = [
        (n["rank"], n["role"], n["url"], n["healthy"], n["latency_ms"], n["error"])
        for n in u["nodes"]
    ]
    return "\n".join(lines) + table(header, nodes)


def summary(u: dict[str, Any]) -> str:
    """After disable/drain/enable/add: what changed and whether the unit is now idle."""
    state = u["admin"]["state"]
    routable = "routable" if u["routable"] else "not routable"
    return f"{u['id']}: {state}, {u['in_flight']} in flight, {routable}" + _why(why_not(u))


def removed(payload: dict[str, Any]) -> str:
    return f"{payload['id']}: removed, {payload['in_flight']} in flight may finish"


def events(payload: dict[str, Any]) -> str:
    header = ("TIME", "UNIT", "WHAT", "WHO", "REASON")
    rows = [
        (when(e["time"]), e["unit"], e["what"], e["who"], e["reason"]) for e in payload["events"]
    ]
    return table(header, rows)


def keys(payload: dict[str, Any]) -> str:
    """`keys list`, `keys create` (the secret, once) and `keys revoke`."""
    if "keys" in payload:
        header = (
            "ID",
            "PREFIX",
            "TENANT",
            "PRIORITY",
            "RPM",
            "TPM",
            "INFLIGHT",
            "EXPIRES",
            "STATE",
        )
        rows = [
            (k["id"], k["prefix"], k["tenant"], k["priority"], k["rpm"], k["tpm"],
             k["max_inflight"], when(k["expires"]), k["state"])
            for k in payload["keys"]
        ]  # fmt: skip
        return table(header, rows)
    line = f"{payload['id']}: tenant {payload['tenant']}, {payload['state']}"
    if "key" not in payload:
        return line
    return f"{line}\n{payload['key']}\n(the key is shown this once: store it now)"


def why_not(u: dict[str, Any]) -> str:
    """The first reason the unit takes no new requests, in the order an operator would fix."""
    admin, health, breaker = u["admin"], u["health"], u["breaker"]
    if admin["state"] != "enabled":
        return _labelled(f"admin {admin['state']}", admin["reason"])
    if not health["healthy"]:
        return _labelled("unhealthy", health["reason"])
    if not u["routable"] and u.get("idle"):
        return _labelled("revision", u["idle"])
    if not u["routable"]:
        return _labelled(f"breaker {breaker.get('state', '?')}", breaker.get("reason"))
    return ""


def when(unix: float | None) -> str:
    if unix is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix))


def _labelled(label: str, reason: object) -> str:
    return f"{label}: {reason}" if reason else label


def _why(reason: object) -> str:
    return f" ({reason})" if reason else ""


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
