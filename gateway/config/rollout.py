"""Settings of rollouts: `[rollout]`, its `[rollout.gates]` and its `[rollout.hooks.NAME]`.

A rollout replaces one revision of the units by another, cell by cell: each cell's share of
traffic on the new revision climbs through `steps`, each held `step_seconds` while the gates
compare the two revisions (gateway/rollout/). An admin request may change the steps and the
gates for its own rollout; these are the defaults it starts from.

Hooks are the operator's own commands and URLs, run at fixed moments of a rollout (to start a
cell's new units, retire its old ones, undo a step, say it is done). They are defined here and
only here: an admin request names hooks, it never carries a command or a URL, so the admin
token alone cannot make the gateway run a program of the caller's choosing.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any
from urllib.parse import urlsplit

from gateway.config.builder import build
from gateway.config.checks import ConfigError, check, positive

# The moments a hook may serve: before a cell's new units take traffic (prepare), after its old
# ones took their last request (retire), when a gate failed and the cell goes back (rollback),
# and when every cell runs the new revision (done).
MOMENTS = ("prepare", "retire", "rollback", "done")
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")  # a hook's name, as admin requests give it
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name (RFC 9110 token)
# Headers a URL hook's request gets from the gateway itself; the bearer token: token_env.
_OWN_HEADERS = frozenset(
    {"host", "content-length", "content-type", "transfer-encoding", "connection", "authorization"}
)


@dataclass(frozen=True, slots=True)
class HookConfig:
    """One `[rollout.hooks.NAME]` table: a command or a URL, exactly one of the two."""

    # The program and its arguments, run without a shell (the first item is looked up in PATH).
    command: tuple[str, ...] = ()
    # Or an http(s):// URL, POSTed the rollout's context as JSON; a 2xx answer is success.
    url: str = ""
    # url only: extra headers sent with the POST.
    headers: dict[str, str] = field(default_factory=dict, hash=False)
    # url only: an environment variable holding a token sent as `Authorization: Bearer`, so the
    # secret lives in no config file ("" = none).
    token_env: str = ""
    # Seconds the hook may take; a command still running then is killed with its children.
    timeout: float = 60.0
    # The moments it serves (a subset of MOMENTS); default: every one.
    when: tuple[str, ...] = MOMENTS

    def __post_init__(self) -> None:
        check(
            bool(self.command) or bool(self.url),
            "command",
            self.command,
            "or url is required (a command to run, or a URL to POST to)",
        )
        check(
            not (self.command and self.url),
            "url",
            self.url,
            "and command are both set: a hook is one or the other",
        )
        check(
            all(self.command) and (not self.command or self.command[0].strip() != ""),
            "command",
            self.command,
            "must be a list of non-empty strings, the program first",
        )
        if self.url:
            parts = urlsplit(self.url)
            check(
                parts.scheme in ("http", "https") and bool(parts.hostname),
                "url",
                self.url,
                "must be an http:// or https:// URL",
            )
        self._check_headers()
        check(
            0 < self.timeout < math.inf, "timeout", self.timeout, "must be > 0 seconds and finite"
        )
        check(bool(self.when), "when", self.when, f"must list at least one of {MOMENTS}")
        check(
            set(self.when) <= set(MOMENTS) and len(set(self.when)) == len(self.when),
            "when",
            self.when,
            f"must list moments of {MOMENTS}, each once",
        )

    def _check_headers(self) -> None:
        for key in ("headers", "token_env"):
            value = getattr(self, key)
            check(self.url != "" or not value, key, value, "only applies to a url hook")
        for name, value in self.headers.items():
            check(
                isinstance(value, str) and _TOKEN.fullmatch(name) is not None,
                "headers",
                name,
                "must map header names to string values",
            )
            check(
                name.lower() not in _OWN_HEADERS,
                "headers",
                name,
                "is set by the gateway itself (a bearer token: token_env)",
            )
            check(_printable(value), "headers", name, "must have a printable ASCII value")
        if self.token_env:
            check(
                _printable(os.environ.get(self.token_env, "")),
                "token_env",
                self.token_env,
                "names an environment variable that is not set (or not printable ASCII)",
            )

    def serves(self, moment: str) -> bool:
        return moment in self.when

    def token(self) -> str:
        """The bearer token from `token_env`, read now ("" = none): it lives in no config
        object, repr or log."""
        return os.environ.get(self.token_env, "") if self.token_env else ""


@dataclass(frozen=True, slots=True)
class GateDefaults:
    """`[rollout.gates]`: what the gates judge a step by. gateway/rollout/gates.py builds its
    GateSettings from these (field for field), so every value allowed here is allowed there.
    Each gate compares the new revision's requests of the step with the old revision's
    requests of the same window, so load and time of day cancel out."""

    # Requests each revision must have answered in the step before any gate judges it.
    min_samples: int = 50
    # The tests' significance level: a step fails when the new revision is worse with at
    # most this chance that the difference is noise.
    alpha: float = 0.05
    # The new revision's error rate may exceed the old one's by this much (absolute: 0.01 =
    # one more failed request in a hundred) before the error gate may fail.
    max_error_excess: float = 0.01
    # The smallest relative slow-down of time to first token and between tokens worth failing
    # a step for (0.10 = 10% slower).
    latency_min_effect: float = 0.10
    # The new revision's p99 latency may be at most this many times the old one's.
    p99_ratio: float = 1.5
    # The new revision's share of streams that break after their first byte may exceed the old
    # one's by this much (absolute).
    max_break_excess: float = 0.01
    # The largest change allowed in the share of answers cut at max_tokens ("length"): a model
    # that suddenly runs on to the limit is broken even if it is fast.
    finish_shift: float = 0.10
    # The guard: a stricter level for the checks made continually during a step, which stop a
    # clearly bad step at once instead of at its end (stricter, as it is looked at many times).
    guard_alpha: float = 0.001

    def __post_init__(self) -> None:
        check(self.min_samples >= 1, "min_samples", self.min_samples, "must be >= 1")
        for key in ("alpha", "guard_alpha"):
            value = getattr(self, key)
            check(0.0 < value < 0.5, key, value, "must be in (0, 0.5)")
        check(
            self.guard_alpha <= self.alpha,
            "guard_alpha",
            self.guard_alpha,
            f"must be <= alpha ({self.alpha:g}): the guard is the stricter test",
        )
        for key in ("max_error_excess", "max_break_excess"):
            value = getattr(self, key)
            check(0.0 <= value < 1.0, key, value, "must be in [0, 1) (a share of requests)")
        check(
            0.0 < self.latency_min_effect < 1.0,
            "latency_min_effect",
            self.latency_min_effect,
            "must be in (0, 1) (a relative slow-down: 0.10 = 10%)",
        )
        check(
            1.0 < self.p99_ratio < math.inf,
            "p99_ratio",
            self.p99_ratio,
            "must be > 1 and finite",
        )
        check(
            0.0 < self.finish_shift < 1.0,
            "finish_shift",
            self.finish_shift,
            "must be in (0, 1) (a share of answers)",
        )


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    # The shares (percent) of a cell's traffic on the new revision, step by step: strictly
    # increasing, ending at 100. The first step is small so a bad revision hurts few requests.
    steps: tuple[int, ...] = (5, 25, 50, 100)
    # Seconds each step is held while the gates watch it (5 minutes: at a few requests a second
    # per cell, enough for min_samples on both revisions, and for slow leaks to show).
    step_seconds: float = 300.0
    # Seconds to wait for a cell's new units to exist and be ready (loading a large model
    # onto a node can take minutes) before the rollout gives up on the cell.
    ready_timeout: float = 600.0
    # Send the golden prompts to both revisions at every step, not only the first.
    golden_every_step: bool = True
    gates: GateDefaults = field(default_factory=GateDefaults)
    # Named hooks ([rollout.hooks.NAME]); an admin request chooses among them by name.
    hooks: dict[str, HookConfig] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        check(bool(self.steps), "steps", self.steps, "must list at least one step")
        check(
            all(0 < s <= 100 for s in self.steps),
            "steps",
            self.steps,
            "must be percentages in (0, 100]",
        )
        check(
            all(a < b for a, b in pairwise(self.steps)),
            "steps",
            self.steps,
            "must be strictly increasing",
        )
        check(
            not self.steps or self.steps[-1] == 100,
            "steps",
            self.steps,
            "must end at 100 (the whole cell on the new revision)",
        )
        positive("step_seconds", self.step_seconds)
        positive("ready_timeout", self.ready_timeout)
        for name in self.hooks:
            check(
                bool(NAME.fullmatch(name)),
                "hooks",
                name,
                "must be named by [a-z0-9][a-z0-9_-]{0,31}",
            )
        # Last: the builder hands the hooks over as raw tables. A bad hook raises its own
        # ConfigError, naming [rollout.hooks.NAME].key (reported with this section's other
        # errors unless one of the rules above failed first).
        object.__setattr__(self, "hooks", _built_hooks(self.hooks))


def _built_hooks(raw: dict[str, Any]) -> dict[str, HookConfig]:
    hooks, errors = {}, []
    for name, table in raw.items():
        if isinstance(table, HookConfig):
            hooks[name] = table
            continue
        try:
            hooks[name] = build(HookConfig, table, f"[rollout.hooks.{name}]")
        except ConfigError as exc:
            errors.append(exc)
    if errors:
        raise ConfigError.of(errors)
    return hooks


def from_toml(table: Any, where: str = "rollout") -> RolloutConfig:
    """`[rollout]` from its TOML table; one ConfigError naming every bad key and value."""
    built: RolloutConfig = build(RolloutConfig, table, where)
    return built


def _printable(value: str) -> bool:
    return value.isascii() and value.isprintable() and value != ""
