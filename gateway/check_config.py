"""`unitgate check-config FILE`: validate a config file and its environment overrides.

Every problem is listed at once, one per line, each naming the key, the bad value and, when
an override set it, the variable; the exit code is then 2. A valid config gets a short summary
and exit 0. Nothing is started and nothing is connected to: start-up checks that need the
machine (the admin token's variable, the state store, free ports) are not made here.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

from gateway.config import Config, ConfigError, load_config
from gateway.config import env as config_env


def main(argv: list[str]) -> int:
    ns = _parser().parse_args(argv)
    try:
        config = load_config(ns.file)
    except ConfigError as exc:
        report(exc)
        count = len(exc.errors)
        print(f"unitgate: {count} error{'s' if count > 1 else ''} in {ns.file}", file=sys.stderr)
        return 2
    print(summary(ns.file, config, _override_names()))
    return 0


def report(error: ConfigError, prog: str = "unitgate", out: TextIO | None = None) -> None:
    """Each of `error`'s problems on a line of its own."""
    for message in error.messages():
        print(f"{prog}: {message}", file=out or sys.stderr)


def summary(path: str, config: Config, overrides: list[str]) -> str:
    units = ", ".join(u.id for u in config.units) or "none"
    lines = [
        f"ok: {path}",
        f"  models: {', '.join(config.gateway.models)}",
        f"  units:  {len(config.units)} ({units})",
        f"  api:    {config.gateway.host}:{config.gateway.port}, "
        f"operator: {config.metrics.host}:{config.metrics.port}",
    ]
    if overrides:
        lines.append(f"  environment overrides: {', '.join(overrides)}")
    return "\n".join(lines)


def _override_names() -> list[str]:
    found, _ = config_env.overrides(Config, os.environ)
    return [o.var for o in found]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="unitgate check-config", description=__doc__)
    p.add_argument(
        "file",
        nargs="?",
        default="config.toml",
        metavar="FILE",
        help="TOML config (default: ./config.toml); UNITGATE__* overrides apply",
    )
    return p
