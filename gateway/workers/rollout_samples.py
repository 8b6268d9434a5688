"""A rollout's windows summed over the workers, for the control plane's driver.

With workers, the control plane drives a rollout but answers no request: each worker's own
collector (gateway/rollout/collector.py) counts its answers by the split its state messages
say, and sends its windows every half second. The driver reads here the sum of
the windows of the split the control plane routes by now (a worker's windows of an earlier
split, not yet replaced, are left out). Workers send them every ROLLOUT_EVERY reports
(link.py).
"""

from __future__ import annotations

from typing import Any

from gateway.rollout.collector import Windows, add_wires, key_of
from gateway.units import UnitRegistry


class FleetSamples:
    def __init__(self) -> None:
        self.units: UnitRegistry | None = None  # the control plane's, once it runs
        self._latest: dict[int, dict[str, Any]] = {}  # worker -> its last windows' wire

    def update(self, index: int, wire: dict[str, Any] | None) -> None:
        if wire is None:
            self._latest.pop(index, None)
        else:
            self._latest[index] = wire

    def forget(self, index: int) -> None:
        self._latest.pop(index, None)

    def windows(self) -> Windows | None:
        canary = None if self.units is None else self.units.canary
        if canary is None:
            return None
        return add_wires(Windows(key_of(canary), canary.old, canary.new), self._latest.values())
