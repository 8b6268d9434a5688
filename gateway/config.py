"""Gateway configuration: frozen dataclasses built from `config.toml` and validated at start.

Every error names the offending key (``[timeouts].first_byte``) and the bad value, so an operator
can fix a typo without reading code. Unknown keys are errors too: a misspelt setting that is
silently ignored is worse than a refusal to start.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    host: str = "127.0.0.1"
    port: int = 8080

    def __post_init__(self) -> None:
        _check(0 <= self.port <= 65535, "port", self.port, "must be 0..65535 (0 = any free port)")


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    # Model ids the gateway serves; a unit may narrow this with its own `models`.
    models: tuple[str, ...] = ("unitgate-sim",)
    max_body_bytes: int = 4 * 1024 * 1024
    # How long in-flight streams may run on after SIGTERM before they are cancelled.
    shutdown_timeout: float = 30.0

    def __post_init__(self) -> None:
        _check(0 <= self.port <= 65535, "port", self.port, "must be 0..65535 (0 = any free port)")
        _check(len(self.models) > 0, "models", self.models, "must list at least one model id")
        _check(
            self.max_body_bytes >= 1024, "max_body_bytes", self.max_body_bytes, "must be >= 1024"
        )
        _positive("shutdown_timeout", self.shutdown_timeout)


@dataclass(frozen=True, slots=True)
class TimeoutConfig:
    """Seconds. `first_byte` runs from sending the request to the first body byte of the answer."""

    connect: float = 2.0
    first_byte: float = 30.0
    idle: float = 30.0
    total: float = 600.0

    def __post_init__(self) -> None:
        for name in ("connect", "first_byte", "idle", "total"):
            _positive(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    # 0 = unbounded. aiohttp's default of 100 silently queues requests beyond it.
    max_connections: int = 0
    keepalive_timeout: float = 30.0

    def __post_init__(self) -> None:
        _check(self.max_connections >= 0, "max_connections", self.max_connections, "must be >= 0")
        _positive("keepalive_timeout", self.keepalive_timeout)


AFFINITY_MODES = ("none", "session", "prefix", "session+prefix")


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    # session: `x-session-id` header or the `user` field; prefix: the first `prefix_chars` of
    # the prompt. Both map keys to units with bounded-load rendezvous hashing.
    affinity: str = "session+prefix"
    prefix_chars: int = 256
    # A unit takes an affine request only while its load <= factor x the fair share.
    bounded_load_factor: float = 1.25

    def __post_init__(self) -> None:
        _check(
            self.affinity in AFFINITY_MODES,
            "affinity",
            self.affinity,
            f"must be one of {AFFINITY_MODES}",
        )
        _check(self.prefix_chars >= 1, "prefix_chars", self.prefix_chars, "must be >= 1")
        _check(
            self.bounded_load_factor >= 1.0,
            "bounded_load_factor",
            self.bounded_load_factor,
            "must be >= 1.0",
        )


@dataclass(frozen=True, slots=True)
class RetryConfig:
    # Attempts per request, the first included; each retry goes to a unit not yet tried.
    max_attempts: int = 3
    # Retries may add at most this share of recent requests, plus `budget_min_per_second`.
    budget_ratio: float = 0.2
    budget_min_per_second: float = 1.0
    budget_window: float = 10.0

    def __post_init__(self) -> None:
        _check(self.max_attempts >= 1, "max_attempts", self.max_attempts, "must be >= 1")
        _check(0.0 <= self.budget_ratio <= 1.0, "budget_ratio", self.budget_ratio, "must be 0..1")
        _check(
            self.budget_min_per_second >= 0,
            "budget_min_per_second",
            self.budget_min_per_second,
            "must be >= 0",
        )
        _check(
            1.0 <= self.budget_window <= 600.0,
            "budget_window",
            self.budget_window,
            "must be 1..600 s",
        )


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    # Per-unit in-flight cap for units that do not set `max_inflight`.
    unit_max_inflight: int = 256
    # Requests that find every unit full wait here, FIFO, for at most `queue_timeout`.
    queue_size: int = 1024
    queue_timeout: float = 5.0
    # Seconds advertised in `Retry-After` on 429 and 503.
    retry_after: int = 1

    def __post_init__(self) -> None:
        _check(
            self.unit_max_inflight >= 1, "unit_max_inflight", self.unit_max_inflight, "must be >= 1"
        )
        _check(self.queue_size >= 0, "queue_size", self.queue_size, "must be >= 0")
        _check(self.queue_timeout >= 0, "queue_timeout", self.queue_timeout, "must be >= 0")
        _check(self.retry_after >= 0, "retry_after", self.retry_after, "must be >= 0")


@dataclass(frozen=True, slots=True)
class UnitConfig:
    id: str
    leader: str
    # Health URLs of every node in rank order; rank 0 is the leader. Defaults to [leader].
    nodes: tuple[str, ...] = ()
    weight: float = 1.0
    max_inflight: int | None = None
    # Empty = every model the gateway serves.
    models: tuple[str, ...] = ()
    # The operator's initial enable bit (the admin API flips it at run time).
    enabled: bool = True

    def __post_init__(self) -> None:
        _check(
            bool(self.id) and self.id.strip() == self.id,
            "id",
            self.id,
            "must be a non-empty id without spaces",
        )
        _url("leader", self.leader)
        for url in self.nodes:
            _url("nodes", url)
        if not self.nodes:
            object.__setattr__(self, "nodes", (self.leader.rstrip("/"),))
        object.__setattr__(self, "leader", self.leader.rstrip("/"))
        _check(self.weight > 0 and math.isfinite(self.weight), "weight", self.weight, "must be > 0")
        if self.max_inflight is not None:
            _check(self.max_inflight >= 1, "max_inflight", self.max_inflight, "must be >= 1")


@dataclass(frozen=True, slots=True)
class Config:
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    metrics: ListenerConfig = field(default_factory=lambda: ListenerConfig(port=8081))
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    units: tuple[UnitConfig, ...] = ()

    def __post_init__(self) -> None:
        ids = [u.id for u in self.units]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        _check(not dupes, "id", dupes, "unit ids must be unique")
        served = set(self.gateway.models)
        for unit in self.units:
            extra = sorted(set(unit.models) - served)
            _check(
                not extra, "models", extra, f"unit {unit.id!r} lists models not in [gateway].models"
            )

    def unit_cap(self, unit: UnitConfig) -> int:
        return (
            unit.max_inflight if unit.max_inflight is not None else self.admission.unit_max_inflight
        )


def load_config(path: str | Path) -> Config:
    """Read and validate a TOML file; raise ConfigError naming the file and the bad key."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return config_from_dict(raw)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def config_from_dict(raw: dict[str, Any]) -> Config:
    config: Config = _build(Config, raw, "")
    return config


# --- the generic builder ----------------------------------------------------------------------


def _build(cls: type[Any], table: Any, where: str) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"{where or 'top level'} must be a table, got {type(table).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key {_key(where, unknown[0])}; known keys: {sorted(fields)}")
    kwargs = {
        name: _convert(hints[name], value, _key(where, name)) for name, value in table.items()
    }
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing required key {_key(where, missing[0])}")
    try:
        return cls(**kwargs)
    except _FieldError as exc:
        raise ConfigError(f"{_key(where, exc.name)} {exc.problem}, got {exc.value!r}") from None


def _convert(hint: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(options[0], value, key)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        if dataclasses.is_dataclass(item):
            return tuple(_build(item, v, f"{key}[{i}]") for i, v in enumerate(value))  # type: ignore[arg-type]
        return tuple(_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key)  # type: ignore[arg-type]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"{key} must be of type {hint.__name__}, got {value!r}")
    return value


def _key(where: str, name: str) -> str:
    if not where:
        return f"[{name}]"
    return f"{where}.{name}" if where.endswith("]") else f"[{where}].{name}"


class _FieldError(Exception):
    def __init__(self, name: str, value: Any, problem: str) -> None:
        super().__init__(name)
        self.name, self.value, self.problem = name, value, problem


def _check(ok: bool, name: str, value: Any, problem: str) -> None:
    if not ok:
        raise _FieldError(name, value, problem)


def _positive(name: str, value: float) -> None:
    _check(value > 0 and math.isfinite(value), name, value, "must be a positive number")


def _url(name: str, url: str) -> None:
    parts = urlsplit(url)
    ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.path in ("", "/")
    _check(ok, name, url, "must be a base URL like http://host:port")
