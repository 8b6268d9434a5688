"""`unitgate admin`: drive the admin API from a shell.

Exit codes: 0 done, 1 the gateway refused (its message is printed), 2 bad usage, 3 the
gateway could not be reached. The token is read from an environment variable, never from
the command line, so it does not end up in shell history or `ps` output.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

import orjson

from gateway.admin import tables
from gateway.admin.client import AdminClient, ClientError

DEFAULT_URL = "http://127.0.0.1:8081"
DEFAULT_TOKEN_ENV = "UNITGATE_ADMIN_TOKEN"

Command = Callable[[AdminClient, argparse.Namespace], Any]


def main(argv: list[str]) -> int:
    ns = parser().parse_args(argv)
    client = AdminClient(ns.url, os.environ.get(ns.token_env, ""), ns.timeout, ns.token_env)
    command, render = COMMANDS[ns.command]
    try:
        payload = command(client, ns)
    except ClientError as exc:
        print(f"unitgate admin: {exc}", file=sys.stderr)
        return exc.exit_code
    print(
        orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode() if ns.json else render(payload)
    )
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="unitgate admin", description=__doc__)
    p.add_argument("--url", default=DEFAULT_URL, help=f"operator listener (default {DEFAULT_URL})")
    p.add_argument("--json", action="store_true", help="print the API's JSON answer")
    p.add_argument(
        "--token-env",
        default=DEFAULT_TOKEN_ENV,
        metavar="NAME",
        help=f"env var holding the bearer token (default {DEFAULT_TOKEN_ENV})",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("units", help="list units and why each is (not) routable")
    sub.add_parser("unit", help="one unit in detail, nodes included").add_argument("id")
    disable = sub.add_parser("disable", help="no new requests; in-flight ones finish")
    disable.add_argument("id")
    disable.add_argument("--reason", required=True, help="why (recorded in the events log)")
    for name, text in (
        ("drain", "like disable, and report when nothing is in flight any more"),
        ("enable", "serve again (once probes and the breaker agree)"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("id")
        cmd.add_argument("--reason", default="", help="why (recorded in the events log)")
    _add_parser(sub)
    sub.add_parser("remove", help="remove a unit; in-flight requests finish").add_argument("id")
    events = sub.add_parser("events", help="admin actions and health/breaker transitions")
    events.add_argument("--limit", type=int, default=100, help="newest N (default 100)")
    events.add_argument("--unit", help="only this unit's events")
    return p


def _add_parser(sub: Any) -> None:
    add = sub.add_parser("add", help="add a unit at run time (routable once its probes pass)")
    add.add_argument("--id", required=True)
    add.add_argument("--leader", required=True, help="base URL serving the OpenAI API")
    add.add_argument(
        "--node", action="append", default=[], help="a node's URL, rank order (repeat)"
    )
    add.add_argument("--weight", type=float)
    add.add_argument("--max-inflight", type=int)
    add.add_argument("--model", action="append", default=[], help="a served model (repeat)")


def _unit_path(ns: argparse.Namespace, action: str = "") -> str:
    return f"/admin/units/{quote(ns.id, safe='')}" + (f"/{action}" if action else "")


def _add_body(ns: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"id": ns.id, "leader": ns.leader}
    optional = {
        "nodes": ns.node,
        "models": ns.model,
        "weight": ns.weight,
        "max_inflight": ns.max_inflight,
    }
    body.update({k: v for k, v in optional.items() if v not in (None, [])})
    return body


def _events_path(ns: argparse.Namespace) -> str:
    query = {"limit": ns.limit, **({"unit": ns.unit} if ns.unit else {})}
    return f"/admin/events?{urlencode(query)}"


COMMANDS: dict[str, tuple[Command, Callable[[Any], str]]] = {
    "units": (lambda c, ns: c.get("/admin/units"), tables.units),
    "unit": (lambda c, ns: c.get(_unit_path(ns)), tables.unit),
    "disable": (
        lambda c, ns: c.post(_unit_path(ns, "disable"), {"reason": ns.reason}),
        tables.summary,
    ),
    "drain": (lambda c, ns: c.post(_unit_path(ns, "drain"), {"reason": ns.reason}), tables.summary),
    "enable": (
        lambda c, ns: c.post(_unit_path(ns, "enable"), {"reason": ns.reason}),
        tables.summary,
    ),
    "add": (lambda c, ns: c.post("/admin/units", _add_body(ns)), tables.summary),
    "remove": (lambda c, ns: c.delete(_unit_path(ns)), tables.removed),
    "events": (lambda c, ns: c.get(_events_path(ns)), tables.events),
}
