"""The gateway's public entry points, for code outside the gateway package (`unitgate up`,
the load tester).

Everything else in `gateway/` is internal and may move between modules; what is named here
keeps its meaning. Config: `load_config`, `config_from_dict`, `Config`, `UnitConfig`,
`ConfigError`. Running: `running(config)` yields a started `Gateway` (its `public_url`,
`metrics_url`, `draining`) and stops it on exit; `is_routable` reads its routing verdict.
Around it: `read_tokens` (the admin tokens a config's environment provides), `is_loopback`
and `raise_fd_limit`, which a process hosting the gateway calls once before it starts, and
`LISTEN_BACKLOG`, the listen backlog the gateway's servers use; `setup_logging(level, format)`
sets a process's log lines up as the gateway's (`LOG_FORMATS`: text or json).

Two leaf modules are public on their own, since importing this module imports the whole
gateway: `gateway.oslimits` (`raise_fd_limit`) and `gateway.net` (`LISTEN_BACKLOG`,
`is_loopback`) depend on nothing but the standard library, so the load generator and the
simulated units, which must run in front of any OpenAI server, use them without it.
"""

from __future__ import annotations

from gateway.admin.auth import read_tokens
from gateway.base.net import LISTEN_BACKLOG, is_loopback
from gateway.base.oslimits import raise_fd_limit
from gateway.config import (
    LOG_FORMATS,
    Config,
    ConfigError,
    UnitConfig,
    config_from_dict,
    load_config,
)
from gateway.observability.logformat import setup as setup_logging
from gateway.server import Gateway, running

__all__ = [
    "LISTEN_BACKLOG",
    "LOG_FORMATS",
    "Config",
    "ConfigError",
    "Gateway",
    "UnitConfig",
    "config_from_dict",
    "is_loopback",
    "is_routable",
    "load_config",
    "raise_fd_limit",
    "read_tokens",
    "running",
    "setup_logging",
]


def is_routable(gateway: Gateway, unit_id: str) -> bool:
    """Whether the gateway routes to the unit on its own verdict: false until a probe round
    has judged it, and for a unit only panic routing lets in."""
    state = gateway.units.units.get(unit_id)
    return state is not None and state.routable
