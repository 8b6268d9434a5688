"""`unitgate admin rollouts`: start, follow, pause, resume and abort a rollout from a shell.

The golden prompts and gate settings are long JSON: they are read from files (`--golden
FILE`, `--gates FILE`), which an operator keeps with the rest of a release.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from gateway.admin.client import AdminClient, ClientError
from gateway.admin.tables import table, when

VERBS = ("start", "status", "list", "pause", "resume", "abort", "verdict")


def add_parser(
    rollouts: argparse.ArgumentParser, after: Callable[[], argparse.ArgumentParser]
) -> None:
    sub = rollouts.add_subparsers(dest="rollouts_command", required=True, metavar="ACTION")
    start = sub.add_parser("start", help="replace one revision by another, cell by cell",
                           parents=[after()])  # fmt: skip
    start.add_argument("--to", required=True, help="the revision to roll out")
    start.add_argument("--from", dest="old", help="the revision replaced (default: the cells')")
    start.add_argument("--cell", action="append", default=[], help="a cell, in order (repeat)")
    start.add_argument("--steps", help="percentages, e.g. 5,25,50,100")
    start.add_argument("--step-seconds", type=float, help="how long each step is judged")
    start.add_argument("--ready-timeout", type=float, help="seconds to wait for new units")
    start.add_argument("--hook", action="append", default=[], help="a [rollout.hooks] name")
    start.add_argument("--golden", type=Path, help="a JSON file: the golden prompts' list")
    start.add_argument("--gates", type=Path, help="a JSON file: gate settings to change")
    start.add_argument("--same-tokenizer", choices=("yes", "no"), default="yes",
                       help="may a stream broken on a new unit resume on an old one")  # fmt: skip
    start.add_argument("--reason", default="", help="why (recorded with the rollout)")
    sub.add_parser("status", help="the current (or last) rollout", parents=[after()])
    sub.add_parser("list", help="rollouts, newest first", parents=[after()])
    for verb, text in (
        ("pause", "hold at the current step (the guards still judge)"),
        ("resume", "carry on; the step starts over on fresh samples"),
        ("abort", "roll back now"),
        ("verdict", "the gates' verdict as JSON-able figures"),
    ):
        sub.add_parser(verb, help=text, parents=[after()])


def run(client: AdminClient, ns: argparse.Namespace) -> Any:
    verb = ns.rollouts_command
    if verb == "start":
        return client.post("/admin/rollouts", start_body(ns))
    if verb == "status":
        return client.get("/admin/rollouts/current")
    if verb == "list":
        return client.get("/admin/rollouts")
    if verb == "verdict":
        return client.get("/admin/rollouts/current/verdict")
    return client.post(f"/admin/rollouts/current/{verb}", None)


def start_body(ns: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"to": ns.to}
    if ns.old is not None:
        body["from"] = ns.old
    if ns.cell:
        body["cells"] = ns.cell
    if ns.steps:
        try:
            body["steps"] = [int(s) for s in ns.steps.split(",")]
        except ValueError:
            raise ClientError(
                f"--steps {ns.steps!r}: whole percentages, comma-separated", 2
            ) from None
    for key in ("step_seconds", "ready_timeout"):
        value = getattr(ns, key)
        if value is not None:
            body[key] = value
    if ns.hook:
        body["hooks"] = ns.hook
    for key in ("golden", "gates"):
        path = getattr(ns, key)
        if path is not None:
            body[key] = _json_file(path, f"--{key}")
    body["resume_across"] = ns.same_tokenizer == "yes"
    if ns.reason:
        body["reason"] = ns.reason
    return body


def _json_file(path: Path, flag: str) -> object:
    try:
        return orjson.loads(path.read_bytes())
    except OSError as exc:
        raise ClientError(f"{flag} {path}: {exc.strerror}", 2) from None
    except orjson.JSONDecodeError as exc:
        raise ClientError(f"{flag} {path}: not JSON: {exc}", 2) from None


def render(payload: Any) -> str:
    if "rollouts" in payload:
        rows = [
            (
                r["id"],
                r["state"],
                r["from"],
                r["to"],
                r["cell"] or "-",
                _share(r),
                when(r["started"]),
            )
            for r in payload["rollouts"]
        ]
        return table(("ID", "STATE", "FROM", "TO", "CELL", "SHARE", "STARTED"), rows)
    if "verdict" in payload:
        lines = [f"rollout {payload['id']}: {payload['state']}, verdict {payload['verdict']}"]
        return "\n".join(lines + [_gate(g) for g in payload["gates"]])
    lines = [
        f"rollout {payload['id']}: {payload['state']} ({payload['from']!r} -> {payload['to']!r})",
        f"  cells:  {', '.join(payload['cells'])}; now {payload['cell'] or '-'}"
        f" at {_share(payload)}",
        f"  reason: {payload['reason'] or '-'}",
    ]
    if payload.get("note"):
        lines.append(f"  note:   {payload['note']}")
    return "\n".join(lines + [_gate(g) for g in payload["gates"]])


def _share(r: dict[str, Any]) -> str:
    return f"{r['share'] * 100:g}%"


def _gate(g: dict[str, Any]) -> str:
    return f"  gate {g['gate']}: {g['outcome']} ({g['reason']})"
