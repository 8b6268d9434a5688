"""Settings of the operator surface: admin API authentication and state, tracing export."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.checks import check

TRACE_EXPORTERS = ("none", "console", "otlp")


@dataclass(frozen=True, slots=True)
class AdminConfig:
    """The admin API shares the operator listener with /metrics ([metrics] host and port)."""

    enabled: bool = True
    token_env: str = "UNITGATE_ADMIN_TOKEN"  # env var holding the bearer token
    token_file: str = ""  # or a file holding it (first line); the env var wins
    # Without a token the admin API refuses to start unless this is true AND it listens on
    # loopback only: then it serves without authentication (local development).
    allow_unauthenticated_loopback: bool = False
    state_file: str = "unitgate-admin.sqlite3"  # admin overrides survive restarts here; "" = off
    events_kept: int = 10_000

    def __post_init__(self) -> None:
        check(bool(self.token_env), "token_env", self.token_env, "must name an env var")
        check(self.events_kept >= 10, "events_kept", self.events_kept, "must be >= 10")


@dataclass(frozen=True, slots=True)
class TracingConfig:
    exporter: str = "none"  # none | console | otlp (otlp needs opentelemetry-exporter-otlp)
    service_name: str = "unitgate"
    otlp_endpoint: str = ""  # empty = the exporter's default / OTEL_EXPORTER_OTLP_ENDPOINT

    def __post_init__(self) -> None:
        check(
            self.exporter in TRACE_EXPORTERS,
            "exporter",
            self.exporter,
            f"must be one of {TRACE_EXPORTERS}",
        )
