"""A rollout's metrics: its state, each cell's split, each gate's last verdict, and how
rollouts ended.

The gauges are read at scrape time from the rollout's view (gateway/rollout/record.py), the
ends are counted from the events log (a subscriber, like the rest of observability), exported
at 0 from the start so that an alert on their increase sees the first one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.observability.events import Event, EventLog

STATES = ("running", "paused", "succeeded", "rolled_back", "aborted")
OUTCOMES = ("pass", "wait", "fail")
ENDS = {
    "rollout succeeded": "succeeded",
    "rollout rolled back": "rolled_back",
    "rollout aborted": "aborted",
}

View = Callable[[], Mapping[str, Any] | None]  # the current (or last) rollout, None: none yet


class RolloutCollector(Collector):
    def __init__(self, view: View) -> None:
        self.view = view

    def collect(self) -> Iterator[GaugeMetricFamily]:
        found = self.view()
        state = GaugeMetricFamily(
            "unitgate_rollout_state",
            "1 for the state of the current (or last) rollout.",
            labels=["state"],
        )
        share = GaugeMetricFamily(
            "unitgate_rollout_share",
            "Share of each cell's conversations on each revision while a rollout runs.",
            labels=["cell", "revision"],
        )
        gate = GaugeMetricFamily(
            "unitgate_rollout_gate",
            "1 for each gate's last outcome (pass, wait, fail) in the current rollout.",
            labels=["gate", "outcome"],
        )
        for name in STATES:
            state.add_metric([name], 1.0 if found is not None and found["state"] == name else 0.0)
        if found is not None and found["state"] in ("running", "paused"):
            for cell in found["cells"]:
                new = _share(found, cell)
                share.add_metric([cell, found["to"]], new)
                share.add_metric([cell, found["from"]], 1.0 - new)
            for verdict in found["gates"]:
                for outcome in OUTCOMES:
                    value = 1.0 if verdict["outcome"] == outcome else 0.0
                    gate.add_metric([verdict["gate"], outcome], value)
        yield state
        yield share
        yield gate


def _share(view: Mapping[str, Any], cell: str) -> float:
    """The new revision's share of `cell` now: 1 in the cells moved, the step's in the cell
    being moved, 0 in the others."""
    cells, current = view["cells"], view["cell"]
    if current is None:
        return 0.0
    if cell == current:
        return float(view["share"])
    return 1.0 if cells.index(cell) < cells.index(current) else 0.0


class RolloutEnds:
    """`unitgate_rollouts_ended_total{state}`: each rollout that ended, by how."""

    def __init__(self, registry: CollectorRegistry, events: EventLog) -> None:
        self.ended = Counter(
            "unitgate_rollouts_ended",
            "Rollouts that ended, by how: succeeded, rolled_back, aborted.",
            ["state"],
            registry=registry,
        )
        for state in ENDS.values():
            self.ended.labels(state)
        events.on_event(self._event)

    def _event(self, event: Event) -> None:
        state = ENDS.get(event.what)
        if state is not None and event.unit.startswith("rollout:"):
            self.ended.labels(state).inc()
