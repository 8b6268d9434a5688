"""What the latency forecast learned and how well it predicts (gateway/routing/forecast.py).

The fitted figures are read at scrape time (`LatencyCollector`), from this process's forecast
or, in the control plane, from its workers' reports. The accuracy of each prediction is
counted by `PredictionObserver`, a subscriber of the request path's signals: measured over
predicted time to first token as each attempt's first token comes, from its being sent; and,
as a request ends, the prompt tokens the gateway predicted its unit's cache held against
those the unit says it held (`cached_tokens` in its usage, where it reports them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.observability.histogram import HistogramFamily
from gateway.relay.usage import Usage
from gateway.routing.forecast import Placed
from gateway.signals import Observer
from gateway.units import UnitState

# A prediction of cached tokens within this share of what the unit reports is exact.
CACHED_WITHIN = 0.05
# measured / predicted: within 10% lands in (0.9, 1.1]
RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.1, 1.25, 1.5, 2.0, 4.0)

Figures = Callable[[], Mapping[str, Mapping[str, float]]]


class LatencyCollector(Collector):
    def __init__(self, figures: Figures) -> None:
        self.figures = figures

    def collect(self) -> Iterator[GaugeMetricFamily]:
        figures = self.figures()
        family = GaugeMetricFamily(
            "unitgate_unit_latency_fit",
            "Each unit's learned latency: `ttft_1k_idle` its seconds to first token for 1,000"
            " uncached prompt tokens when idle; ttft = ttft_base + ttft_per_kilotoken_uncached"
            " x k + ttft_per_kilotoken_queued x k + ttft_per_running x n; tpot = tpot_base +"
            " tpot_per_running x n (seconds); `queued_tokens` the prefill this gateway has"
            " sent it not yet answered; `overtaken_share` the share of its answers a hedge"
            " overtook over the hedge window (probation).",
            labels=["unit", "figure"],
        )
        for unit, values in figures.items():
            for name, value in values.items():
                family.add_metric([unit, name], value)
        yield family


class Timed(Protocol):
    @property
    def placed(self) -> Placed | None: ...

    @property
    def streamed(self) -> bool: ...

    @property
    def usage(self) -> Usage | None: ...

    @property
    def attempts(self) -> int: ...


class PredictionObserver(Observer[Timed]):
    def __init__(
        self, ratio: HistogramFamily, clock: Callable[[], float], registry: CollectorRegistry
    ) -> None:
        self.ratio, self.clock = ratio, clock
        self.cached = Counter(
            "unitgate_prefix_cached_tokens",
            "Prompt tokens of requests whose unit reported its cached tokens: as the gateway"
            " predicted its cache held them (`predicted`), and as the unit said (`reported`),"
            " by unit.",
            ["unit", "source"],
            registry=registry,
        )
        self.predictions = Counter(
            "unitgate_prefix_predictions",
            "Requests whose unit reported its cached tokens, by unit and how the gateway's"
            " prediction compared: `exact` (within 5%), `over` (it routed for cached blocks"
            " the unit no longer held: a misroute), `under`.",
            ["unit", "outcome"],
            registry=registry,
        )

    def attempt_opened(self, call: Timed, unit: UnitState, status: int) -> None:
        placed = call.placed
        if placed is None or placed.predicted is None or placed.sent <= 0.0:
            return
        if status != 200 or not call.streamed or placed.unit != unit.id:
            return
        measured = self.clock() - placed.sent
        if placed.predicted > 0.0:
            self.ratio.labels(unit.id).observe(measured / placed.predicted)

    def ended(self, call: Timed) -> None:
        placed, usage = call.placed, call.usage
        if placed is None or usage is None or usage.cached is None or call.attempts != 1:
            return
        predicted, reported = placed.cached, usage.cached
        self.cached.labels(placed.unit, "predicted").inc(predicted)
        self.cached.labels(placed.unit, "reported").inc(reported)
        self.predictions.labels(placed.unit, cached_outcome(predicted, reported)).inc()


def cached_outcome(predicted: int, reported: int) -> str:
    if abs(predicted - reported) <= CACHED_WITHIN * max(reported, 1):
        return "exact"
    return "over" if predicted > reported else "under"


def ratio_family() -> HistogramFamily:
    return HistogramFamily(
        "unitgate_ttft_prediction_ratio",
        "Measured over predicted time to first token of each attempt the latency forecast"
        " predicted, from its being sent, by unit (1 is exact).",
        "unit",
        RATIO_BUCKETS,
    )


def merged_figures(parts: list[Mapping[str, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """The workers' figures as one: per unit and figure, the median of the workers that
    learned it (each worker learns from its own share of the traffic)."""
    values: dict[str, dict[str, list[float]]] = {}
    for part in parts:
        for unit, figures in part.items():
            for name, value in figures.items():
                values.setdefault(unit, {}).setdefault(name, []).append(value)
    return {
        unit: {name: sorted(v)[len(v) // 2] for name, v in figures.items()}
        for unit, figures in values.items()
    }
