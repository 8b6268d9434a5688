"""Each unit's learned latency on the status page: what the forecast (gateway/routing/
forecast.py) says it takes to answer, read when a snapshot is built."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Figures = Callable[[], Mapping[str, Mapping[str, float]]]


class Latency:
    def __init__(self, figures: Figures) -> None:
        self._figures = figures

    def annotate(self, snapshot: dict[str, Any]) -> None:
        """Set `latency` on each unit whose figures are learned: its seconds to first token
        for 1,000 uncached prompt tokens when idle, and its seconds per output token alone."""
        figures = self._figures()
        for unit in snapshot.get("units", ()):
            found = figures.get(unit["id"])
            if found is not None and "ttft_1k_idle" in found:  # learned, not only overtaken
                unit["latency"] = {
                    "ttft_1k_idle_s": found["ttft_1k_idle"],
                    "tpot_s": found["tpot_base"] + found["tpot_per_running"],
                    "queued_tokens": found.get("queued_tokens", 0.0),
                }
