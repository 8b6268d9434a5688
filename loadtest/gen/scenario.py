"""Scenario files: faults and admin actions scheduled at fixed times during a load run.

The whole file is checked before any load is sent, so a typo cannot surface halfway through a
long run; each message names the key (`actions[2].signal`). Parsing is kept apart from firing
(`loadtest.gen.actions`) so it stays a pure function that tests can drive directly.
"""

from __future__ import annotations

import os
import signal
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ADMIN_ACTIONS = ("disable", "drain", "enable")
SIGNALS = {
    "kill": signal.SIGKILL,
    "stop": signal.SIGSTOP,
    "cont": signal.SIGCONT,
    "term": signal.SIGTERM,
}
DEFAULT_ADMIN_URL = "http://127.0.0.1:8081"
DEFAULT_REASON = "loadtest scenario"
TOKEN_ENV = "UNITGATE_ADMIN_TOKEN"
KINDS = ("admin", "signal", "sim_fault")
_COMMON = {"at", *KINDS}
_ALLOWED = {
    "admin": _COMMON | {"unit", "reason", "admin_url"},
    "signal": _COMMON | {"pid", "health_url"},
    "sim_fault": _COMMON,
}


class ScenarioError(ValueError):
    """A scenario file the run cannot use; the message names the offending key."""


@dataclass(frozen=True, slots=True)
class AdminAction:
    """`token` is read when the file is loaded so every action of a run uses the same one."""

    action: str
    unit: str
    reason: str | None
    admin_url: str
    token: str | None


@dataclass(frozen=True, slots=True)
class SignalAction:
    """Exactly one of `pid` and `health_url`; the latter is asked for the pid at firing time."""

    name: str
    pid: int | None
    health_url: str | None


@dataclass(frozen=True, slots=True)
class SimFaultAction:
    """Test-tool action: set a fault on a simulated unit through its control API."""

    control: str
    unit: str
    fault: dict[str, object]


Kind = AdminAction | SignalAction | SimFaultAction


@dataclass(frozen=True, slots=True)
class Action:
    index: int
    at: float
    kind: Kind

    @property
    def kind_name(self) -> str:
        """The scenario key that chose the kind: admin, signal or sim_fault."""
        if isinstance(self.kind, AdminAction):
            return "admin"
        return "signal" if isinstance(self.kind, SignalAction) else "sim_fault"

    def describe(self) -> str:
        """One short line for the summary table."""
        k = self.kind
        if isinstance(k, AdminAction):
            return f"admin {k.action} {k.unit}"
        if isinstance(k, SignalAction):
            return f"signal {k.name} " + (
                f"pid {k.pid}" if k.pid is not None else f"{k.health_url}"
            )
        return f"sim_fault {k.unit} {k.fault.get('mode')}"


def load_scenario(path: Path) -> list[Action]:
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"scenario {path} is not valid TOML: {exc}") from None
    return parse_scenario(raw)


def parse_scenario(raw: dict[str, object]) -> list[Action]:
    unknown = set(raw) - {"actions"}
    if unknown:
        raise ScenarioError(f"unknown key {sorted(unknown)[0]!r} (only [[actions]] is read)")
    actions = raw.get("actions", [])
    if not isinstance(actions, list) or not actions:
        raise ScenarioError("actions: give at least one [[actions]] table")
    parsed = [_action(i, entry) for i, entry in enumerate(actions)]
    return sorted(parsed, key=lambda a: (a.at, a.index))


def _action(index: int, entry: object) -> Action:
    where = f"actions[{index}]"
    if not isinstance(entry, dict):
        raise ScenarioError(f"{where}: must be a table")
    kinds = [k for k in KINDS if k in entry]
    if len(kinds) != 1:
        raise ScenarioError(f"{where}: give exactly one of {', '.join(KINDS)}")
    kind = kinds[0]
    for key in entry:
        if key not in _ALLOWED[kind]:
            raise ScenarioError(f"{where}.{key}: unknown key for a {kind} action")
    at = entry.get("at")
    if isinstance(at, bool) or not isinstance(at, int | float) or at < 0:
        raise ScenarioError(f"{where}.at: must be a number of seconds >= 0")
    builders: dict[str, Callable[[str, dict[str, object]], Kind]]
    builders = {"admin": _admin, "signal": _signal, "sim_fault": _sim_fault}
    return Action(index, float(at), builders[kind](where, entry))


def _text(where: str, entry: dict[str, object], key: str, default: str | None = None) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str) or not value:
        raise ScenarioError(f"{where}.{key}: must be a non-empty string")
    return value


def _url(where: str, entry: dict[str, object], key: str, default: str | None = None) -> str:
    value = _text(where, entry, key, default)
    if not value.startswith(("http://", "https://")):
        raise ScenarioError(f"{where}.{key}: must start with http:// or https://")
    return value.rstrip("/")


def _admin(where: str, entry: dict[str, object]) -> AdminAction:
    action = entry["admin"]
    if action not in ADMIN_ACTIONS:
        raise ScenarioError(f"{where}.admin: must be one of {', '.join(ADMIN_ACTIONS)}")
    assert isinstance(action, str)
    reason = entry.get("reason")
    if reason is not None:
        reason = _text(where, entry, "reason")
    elif action == "disable":
        reason = DEFAULT_REASON  # the gateway refuses a disable without a reason
    unit = _text(where, entry, "unit")
    url = _url(where, entry, "admin_url", DEFAULT_ADMIN_URL)
    return AdminAction(action, unit, reason, url, os.environ.get(TOKEN_ENV) or None)


def _signal(where: str, entry: dict[str, object]) -> SignalAction:
    name = entry["signal"]
    if not isinstance(name, str) or name not in SIGNALS:
        raise ScenarioError(f"{where}.signal: must be one of {', '.join(SIGNALS)}")
    if ("pid" in entry) == ("health_url" in entry):
        raise ScenarioError(f"{where}: give exactly one of pid and health_url")
    if "health_url" in entry:
        return SignalAction(name, None, _url(where, entry, "health_url"))
    pid = entry["pid"]
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        raise ScenarioError(f"{where}.pid: must be a process id > 1")
    return SignalAction(name, pid, None)


def _sim_fault(where: str, entry: dict[str, object]) -> SimFaultAction:
    body = entry["sim_fault"]
    if not isinstance(body, dict):
        raise ScenarioError(f"{where}.sim_fault: must be a table with control, unit and mode")
    key = f"{where}.sim_fault"
    control = _url(key, body, "control")
    unit = _text(key, body, "unit")
    _text(key, body, "mode")
    fault = {k: v for k, v in body.items() if k not in ("control", "unit")}
    return SimFaultAction(control, unit, fault)
