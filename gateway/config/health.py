"""Settings of unit health: the per-unit probers and the per-unit circuit breakers."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.checks import check, positive


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """Defaults eject a unit within 1 s of a node dying and within 2 s of one freezing (a
    stock vLLM leader that was busy when its /metrics was last read: within 2 x its
    `load_interval` of that read; docs/concepts.md, "A stock vLLM's own report vouches too")."""

    enabled: bool = True
    interval: float = 0.25  # seconds between probe rounds of one unit
    jitter: float = 0.1  # +- share of interval, so probers of many units do not align
    timeout: float = 0.2  # per node probe
    fall: int = 2  # consecutive failed rounds to mark a unit down
    rise: int = 2  # consecutive good rounds to mark it up again
    # The leader reports pending > 0 but its progress (else its step) has not moved for this
    # long: a hung collective.
    stall_timeout: float = 1.5
    canary_every: int = 0  # every K rounds also run a 1-token completion; 0 = off
    canary_timeout: float = 2.0
    # Probe timeouts are soft: while the unit's traffic flows (an answer began or completed, or
    # one of its streams got data, within max(traffic_window, pace_factor x that stream's own
    # gap between reads)) they make the unit `slow`, not unhealthy. A slow unit gets
    # `slow_weight` of its share of new requests, so for it the window is traffic_window /
    # slow_weight (4 s).
    traffic_window: float = 1.0
    pace_factor: float = 4.0
    slow_weight: float = 0.25  # a slow unit's routing weight, as a share of its own
    # Fewer than this share of a model's units in service routable: route across the ones out
    # for soft reasons or by their breaker too. 0 = never.
    panic_threshold: float = 0.5
    # A unit whose learned prefill time per token ([routing] latency_model) is more than this
    # many times the fleet's median (of at least three units) is `slow`, with that reason: a
    # multi-node unit with a lagging node shows here before a probe fails. 0 = never.
    prefill_lag_factor: float = 2.0

    def slow_grace(self) -> float:
        """How long traffic last seen flowing still vouches for a `slow` unit: its share of
        new requests is `slow_weight`, so the window grows to `traffic_window / slow_weight`."""
        return self.traffic_window * (1.0 / self.slow_weight - 1.0)

    def __post_init__(self) -> None:
        for name in (
            "interval",
            "timeout",
            "stall_timeout",
            "canary_timeout",
            "traffic_window",
            "pace_factor",
        ):
            positive(name, getattr(self, name))
        check(0.0 < self.slow_weight <= 1.0, "slow_weight", self.slow_weight, "must be in (0, 1]")
        check(
            0.0 <= self.panic_threshold <= 1.0,
            "panic_threshold",
            self.panic_threshold,
            "must be in [0, 1]",
        )
        check(0.0 <= self.jitter < 1.0, "jitter", self.jitter, "must be in [0, 1)")
        check(
            self.prefill_lag_factor == 0.0 or self.prefill_lag_factor > 1.0,
            "prefill_lag_factor",
            self.prefill_lag_factor,
            "must be > 1 (times the fleet's median), or 0 for never",
        )
        check(self.fall >= 1, "fall", self.fall, "must be >= 1")
        check(self.rise >= 1, "rise", self.rise, "must be >= 1")
        check(self.canary_every >= 0, "canary_every", self.canary_every, "must be >= 0")


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """Trips on `consecutive_failures`, or on a failure rate over `window` seconds once at least
    `min_requests` were seen; ejects for `base_ejection` doubling up to `max_ejection`."""

    enabled: bool = True
    consecutive_failures: int = 5
    failure_rate: float = 0.5
    window: float = 10.0
    min_requests: int = 20
    base_ejection: float = 1.0
    max_ejection: float = 60.0
    probe_requests: int = 3  # trial requests let through after an ejection
    max_ejected_share: float = 0.5  # never eject more than this share of units (panic cap)

    def __post_init__(self) -> None:
        for name in ("window", "base_ejection", "max_ejection"):
            positive(name, getattr(self, name))
        check(
            self.consecutive_failures >= 1,
            "consecutive_failures",
            self.consecutive_failures,
            "must be >= 1",
        )
        check(
            0.0 < self.failure_rate <= 1.0, "failure_rate", self.failure_rate, "must be in (0, 1]"
        )
        check(self.min_requests >= 1, "min_requests", self.min_requests, "must be >= 1")
        check(
            self.max_ejection >= self.base_ejection,
            "max_ejection",
            self.max_ejection,
            "must be >= base_ejection",
        )
        check(self.probe_requests >= 1, "probe_requests", self.probe_requests, "must be >= 1")
        check(
            0.0 <= self.max_ejected_share <= 1.0,
            "max_ejected_share",
            self.max_ejected_share,
            "must be in [0, 1]",
        )
