"""`[metrics]`: the operator listener, and how much the per-tenant metrics may label."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.checks import check as _check
from gateway.config.checks import positive as _positive
from gateway.config.proxy import ListenerConfig

TENANTS_TOP_MAX = 1000  # beyond this a per-tenant label is a cardinality problem, not a metric


@dataclass(frozen=True, slots=True)
class MetricsConfig(ListenerConfig):
    port: int = 8081
    # Tenants that may get their own `tenant` label value; every other one is "other"
    # (observability/tenant_labels.py). 0 = every tenant is "other".
    tenants_top: int = 20
    # Seconds of served tokens the fairness index looks back over (fairness.py).
    fairness_window: float = 60.0

    def __post_init__(self) -> None:
        ListenerConfig.__post_init__(self)
        _check(
            isinstance(self.tenants_top, int) and 0 <= self.tenants_top <= TENANTS_TOP_MAX,
            "tenants_top",
            self.tenants_top,
            f"must be an integer 0..{TENANTS_TOP_MAX}",
        )
        _positive("fairness_window", self.fairness_window)
