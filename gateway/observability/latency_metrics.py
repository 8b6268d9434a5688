"""What the latency forecast learned and how well it predicts (gateway/routing/forecast.py).

The fitted figures are read at scrape time (`LatencyCollector`), from this process's forecast
or, in the control plane, from its workers' reports; the accuracy of each prediction is
counted as its attempt's first token comes (`PredictionObserver`, a subscriber of the request
path's signals): measured over predicted time to first token, from the attempt being sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.observability.histogram import HistogramFamily
from gateway.routing.forecast import Placed
from gateway.signals import Observer
from gateway.units import UnitState

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
            " sent it not yet answered.",
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


class PredictionObserver(Observer[Timed]):
    def __init__(self, ratio: HistogramFamily, clock: Callable[[], float]) -> None:
        self.ratio, self.clock = ratio, clock

    def attempt_opened(self, call: Timed, unit: UnitState, status: int) -> None:
        placed = call.placed
        if placed is None or placed.predicted is None or placed.sent <= 0.0:
            return
        if status != 200 or not call.streamed or placed.unit != unit.id:
            return
        measured = self.clock() - placed.sent
        if placed.predicted > 0.0:
            self.ratio.labels(unit.id).observe(measured / placed.predicted)


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
