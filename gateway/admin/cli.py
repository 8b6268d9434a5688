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

from gateway.admin import rollout_cli, tables
from gateway.admin.client import AdminClient, ClientError
from gateway.admin.drain_wait import DEFAULT_WAIT, wait_drained

DEFAULT_URL = "http://127.0.0.1:8081"
DEFAULT_TOKEN_ENV = "UNITGATE_ADMIN_TOKEN"

Command = Callable[[AdminClient, argparse.Namespace], Any]


def main(argv: list[str]) -> int:
    p = parser()
    ns = p.parse_args(argv)
    if ns.command == "drain" and ns.wait_timeout is not None and not ns.wait:
        p.error(
            "drain --timeout is how long --wait waits; the request timeout goes before the verb"
        )
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
    p = argparse.ArgumentParser(
        prog="unitgate admin", description=__doc__, parents=[_global_flags()]
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def verb(name: str, text: str, timeout: bool = True) -> argparse.ArgumentParser:
        """A subcommand that takes the global flags after it too."""
        parent = _global_flags(after_verb=True, timeout=timeout)
        made: argparse.ArgumentParser = sub.add_parser(name, help=text, parents=[parent])
        return made

    verb("units", "list units and why each is (not) routable")
    verb("unit", "one unit in detail, nodes included").add_argument("id")
    disable = verb("disable", "no new requests; in-flight ones finish")
    disable.add_argument("id")
    disable.add_argument("--reason", required=True, help="why (recorded in the events log)")
    _drain_parser(verb("drain", "like disable; --wait: until nothing is in flight", False))
    enable = verb("enable", "serve again (once probes and the breaker agree)")
    enable.add_argument("id")
    enable.add_argument("--reason", default="", help="why (recorded in the events log)")
    _add_parser(verb("add", "add a unit at run time (routable once its probes pass)"))
    verb("remove", "remove a unit; in-flight requests finish").add_argument("id")
    events = verb("events", "admin actions and health/breaker transitions")
    events.add_argument("--limit", type=int, default=100, help="newest N (default 100)")
    events.add_argument("--unit", help="only this unit's events")
    _keys_parser(verb("keys", "data-plane API keys: create, list, revoke"))
    rollout_cli.add_parser(
        verb("rollouts", "replace a revision cell by cell: start, status, pause, abort..."),
        lambda: _global_flags(after_verb=True),
    )
    return p


def _keys_parser(keys: argparse.ArgumentParser) -> None:
    sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    after = [_global_flags(after_verb=True)]
    create = sub.add_parser("create", help="make a key (its secret is printed once)", parents=after)
    create.add_argument("--tenant", required=True, help="who the key's requests are from")
    create.add_argument("--priority", help="its highest priority class")
    create.add_argument("--default-priority", help="the class of requests that ask for none")
    for limit, text in (("rpm", "requests per minute"), ("tpm", "tokens per minute")):
        create.add_argument(f"--{limit}", type=int, help=f"{text} (default unlimited)")
    create.add_argument("--max-inflight", type=int, help="requests at once (default unlimited)")
    create.add_argument("--expires", help="Unix seconds or an RFC 3339 time (default never)")
    sub.add_parser("list", help="every key, never a secret", parents=after)
    revoke = sub.add_parser("revoke", help="refused by every replica from now on", parents=after)
    revoke.add_argument("id", help="the key's id (key_...)")


def _global_flags(after_verb: bool = False, timeout: bool = True) -> argparse.ArgumentParser:
    """The flags every command takes, before the verb or after it. After it they default to
    SUPPRESS, so a flag given only before the verb is not reset by the subcommand's copy."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if after_verb else value

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--url", default=default(DEFAULT_URL), help=f"operator listener (default {DEFAULT_URL})"
    )
    p.add_argument(
        "--json", action="store_true", default=default(False), help="print the API's JSON answer"
    )
    p.add_argument(
        "--token-env",
        default=default(DEFAULT_TOKEN_ENV),
        metavar="NAME",
        help=f"env var holding the bearer token (default {DEFAULT_TOKEN_ENV})",
    )
    if timeout:  # drain's own --timeout is its wait's
        p.add_argument(
            "--timeout",
            type=float,
            default=default(10.0),
            help="seconds for each request (default 10)",
        )
    return p


def _drain_parser(drain: argparse.ArgumentParser) -> None:
    drain.add_argument("id")
    drain.add_argument("--reason", default="", help="why (recorded in the events log)")
    drain.add_argument(
        "--wait",
        action="store_true",
        help="exit 0 once nothing is in flight on the unit on any replica (1 on timeout)",
    )
    drain.add_argument(
        "--timeout",
        dest="wait_timeout",
        type=float,
        metavar="S",
        help=f"with --wait: give up after S seconds (default {DEFAULT_WAIT:g}: the default"
        " [timeouts].total, plus time for the replicas to report)",
    )


def _drain(client: AdminClient, ns: argparse.Namespace) -> Any:
    unit = client.post(_unit_path(ns, "drain"), {"reason": ns.reason})
    if not ns.wait or unit.get("drained"):
        return unit
    within = DEFAULT_WAIT if ns.wait_timeout is None else ns.wait_timeout
    return wait_drained(client, ns.id, within)


def _add_parser(add: argparse.ArgumentParser) -> None:
    add.add_argument("--id", required=True)
    add.add_argument("--leader", required=True, help="base URL serving the OpenAI API")
    add.add_argument(
        "--node", action="append", default=[], help="a node's URL, rank order (repeat)"
    )
    add.add_argument("--weight", type=float)
    add.add_argument("--max-inflight", type=int)
    add.add_argument("--model", action="append", default=[], help="a served model (repeat)")
    add.add_argument("--cell", help='its cell (default "default")')
    add.add_argument("--revision", help="its revision label (default none)")


def _unit_path(ns: argparse.Namespace, action: str = "") -> str:
    return f"/admin/units/{quote(ns.id, safe='')}" + (f"/{action}" if action else "")


def _add_body(ns: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"id": ns.id, "leader": ns.leader}
    optional = {
        "nodes": ns.node,
        "models": ns.model,
        "weight": ns.weight,
        "max_inflight": ns.max_inflight,
        "cell": ns.cell,
        "revision": ns.revision,
    }
    body.update({k: v for k, v in optional.items() if v not in (None, [])})
    return body


def _keys(client: AdminClient, ns: argparse.Namespace) -> Any:
    if ns.keys_command == "list":
        return client.get("/admin/keys")
    if ns.keys_command == "revoke":
        return client.delete(f"/admin/keys/{quote(ns.id, safe='')}")
    expires: object = ns.expires
    if isinstance(expires, str) and expires.replace(".", "", 1).isdigit():
        expires = float(expires)
    body = {
        "tenant": ns.tenant,
        "priority": ns.priority,
        "default_priority": ns.default_priority,
        "rpm": ns.rpm,
        "tpm": ns.tpm,
        "max_inflight": ns.max_inflight,
        "expires": expires,
    }
    return client.post("/admin/keys", {k: v for k, v in body.items() if v is not None})


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
    "drain": (_drain, tables.summary),
    "enable": (
        lambda c, ns: c.post(_unit_path(ns, "enable"), {"reason": ns.reason}),
        tables.summary,
    ),
    "add": (lambda c, ns: c.post("/admin/units", _add_body(ns)), tables.summary),
    "remove": (lambda c, ns: c.delete(_unit_path(ns)), tables.removed),
    "events": (lambda c, ns: c.get(_events_path(ns)), tables.events),
    "keys": (_keys, tables.keys),
    "rollouts": (rollout_cli.run, rollout_cli.render),
}
