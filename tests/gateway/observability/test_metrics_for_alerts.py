"""The series deploy/prometheus's alerts need from the gateway: whether the operator keeps a
unit in service, what each node's engine last reported, and counters that start at 0."""

from __future__ import annotations

from gateway.config import UnitConfig
from gateway.observability.metrics import Metrics
from gateway.units import UnitRegistry
from tests.support import gateway_config


def setup() -> tuple[UnitRegistry, Metrics]:
    unit = {"id": "u0", "leader": "http://127.0.0.1:9", "nodes": ["http://127.0.0.1:9"] * 2}
    registry = UnitRegistry(gateway_config([unit]))
    return registry, Metrics(registry, lambda: 0)


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_in_service_is_what_the_operator_allows() -> None:
    registry, metrics = setup()
    assert value(metrics, "unitgate_unit_in_service", unit="u0") == 1.0
    registry.set_bit("u0", "draining", True)
    assert value(metrics, "unitgate_unit_in_service", unit="u0") == 0.0
    registry.set_bit("u0", "draining", False)
    registry.set_bit("u0", "enabled", False)
    assert value(metrics, "unitgate_unit_in_service", unit="u0") == 0.0


def test_engine_step_and_pending_follow_the_last_probe() -> None:
    registry, metrics = setup()
    assert value(metrics, "unitgate_node_engine_step", unit="u0", rank="0") is None
    leader = registry.units["u0"].nodes[0]
    leader.step, leader.pending = 41, 3
    assert value(metrics, "unitgate_node_engine_step", unit="u0", rank="0") == 41.0
    assert value(metrics, "unitgate_node_engine_pending", unit="u0", rank="0") == 3.0
    assert value(metrics, "unitgate_node_engine_step", unit="u0", rank="1") is None
    leader.step = leader.pending = None  # the probe got no answer
    assert value(metrics, "unitgate_node_engine_step", unit="u0", rank="0") is None


def test_counters_alerts_count_start_at_zero_for_every_unit() -> None:
    registry, metrics = setup()
    registry.add(UnitConfig(id="u1", leader="http://127.0.0.1:9", nodes=("http://127.0.0.1:9",)))
    for unit in ("u0", "u1"):
        for to in ("ejected", "probing", "admitting", "suppressed"):
            assert value(metrics, "unitgate_breaker_transitions_total", unit=unit, to=to) == 0
        for outcome in ("ok", "gave_up", "unsupported"):
            labels = {"unit": unit, "outcome": outcome}
            assert value(metrics, "unitgate_resumptions_total", **labels) == 0
    for reason in ("saturated", "no_routable_unit"):
        assert value(metrics, "unitgate_admission_rejections_total", reason=reason) == 0
