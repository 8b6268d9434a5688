"""Gateway configuration: frozen dataclasses built from `config.toml` and validated at start.

Every error names the offending key (``[timeouts].first_byte``) and the bad value, so an operator
can fix a typo without reading code. Sections live in their own modules; this one assembles
them and loads the file.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.config import env as _env
from gateway.config.admin import TRACE_EXPORTERS, AdminConfig, TracingConfig
from gateway.config.auth import AuthConfig
from gateway.config.builder import build as _build
from gateway.config.checks import ConfigError
from gateway.config.checks import check as _check
from gateway.config.health import BreakerConfig, HealthConfig
from gateway.config.hedge import HedgeConfig
from gateway.config.limits import LimitsConfig
from gateway.config.logging import LOG_FORMATS, LoggingConfig
from gateway.config.metrics import MetricsConfig
from gateway.config.priority import PriorityClass, PriorityConfig
from gateway.config.proxy import (
    AFFINITY_MODES,
    AdmissionConfig,
    GatewayConfig,
    ListenerConfig,
    ResumeConfig,
    RetryConfig,
    RoutingConfig,
    TimeoutConfig,
    UpstreamConfig,
)
from gateway.config.rollout import GateDefaults, HookConfig, RolloutConfig
from gateway.config.state import StateConfig
from gateway.config.unit import KINDS, UnitConfig

__all__ = [
    "AFFINITY_MODES",
    "KINDS",
    "LOG_FORMATS",
    "TRACE_EXPORTERS",
    "AdminConfig",
    "AdmissionConfig",
    "AuthConfig",
    "BreakerConfig",
    "Config",
    "ConfigError",
    "GateDefaults",
    "GatewayConfig",
    "HealthConfig",
    "HedgeConfig",
    "HookConfig",
    "LimitsConfig",
    "ListenerConfig",
    "LoggingConfig",
    "MetricsConfig",
    "PriorityClass",
    "PriorityConfig",
    "ResumeConfig",
    "RetryConfig",
    "RolloutConfig",
    "RoutingConfig",
    "StateConfig",
    "TimeoutConfig",
    "TracingConfig",
    "UnitConfig",
    "UpstreamConfig",
    "config_from_dict",
    "load_config",
]


@dataclass(frozen=True, slots=True)
class Config:
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    resume: ResumeConfig = field(default_factory=ResumeConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    state: StateConfig = field(default_factory=StateConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    # Priority classes; None (no [priority] table) = one class, `standard`, as [admission] sizes it.
    priority: PriorityConfig | None = None
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    # Rollouts' default steps and gates, and the hooks an admin request may name.
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    # Hedged requests: which, after how long, within what budget (with [priority], each
    # class's `hedge` says which).
    hedge: HedgeConfig = field(default_factory=HedgeConfig)
    units: tuple[UnitConfig, ...] = ()

    def __post_init__(self) -> None:
        _check(
            not self.auth.required or self.admin.enabled,
            "auth",
            "required = true",
            "needs the admin API ([admin].enabled = true): keys are made and loaded through it",
        )
        unknown = sorted(set(self.routing.tokenizers) - set(self.gateway.models))
        _check(not unknown, "tokenizers", unknown, "names models not in [gateway].models")
        ids = [u.id for u in self.units]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        _check(not dupes, "id", dupes, "unit ids must be unique")
        served = set(self.gateway.models)
        for unit in self.units:
            extra = sorted(set(unit.models) - served)
            _check(
                not extra, "models", extra, f"unit {unit.id!r} lists models not in [gateway].models"
            )
            public = unit.models or self.gateway.models
            _check(
                not unit.served_model or len(public) == 1,
                "served_model",
                unit.served_model,
                f"unit {unit.id!r} serves {len(public)} models: served_model needs exactly one"
                " (set the unit's models)",
            )

    def unit_cap(self, unit: UnitConfig) -> int:
        return (
            unit.max_inflight if unit.max_inflight is not None else self.admission.unit_max_inflight
        )


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate a TOML file with the `UNITGATE__` overrides of `environ` (default:
    this process's environment; see env.py) applied; raise one ConfigError listing every
    problem, each naming the file, the bad key and, if one set it, the variable."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    found, errors = _env.overrides(Config, os.environ if environ is None else environ)
    raw, unplaced = _env.apply(raw, found)
    errors += unplaced
    try:
        config = config_from_dict(raw)
    except ConfigError as exc:
        errors.append(_env.annotate(exc, found))
    if errors:
        raise ConfigError.of(errors).mapped(lambda e: f"{path}: {e}") from None
    return config


def config_from_dict(raw: dict[str, Any]) -> Config:
    config: Config = _build(Config, raw, "")
    return config
