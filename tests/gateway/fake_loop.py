"""An event loop's clock and timers, nothing else: the tests say when timers run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class FakeHandle:
    def __init__(self, when: float, callback: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.when, self.callback, self.args = when, callback, args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """call_at and a clock: `advance` runs what is due, in time order; `run_next` runs the one
    armed timer, as late as told."""

    def __init__(self) -> None:
        self.now = 100.0
        self.handles: list[FakeHandle] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., None], *args: Any) -> FakeHandle:
        handle = FakeHandle(when, callback, args)
        self.handles.append(handle)
        return handle

    def armed(self) -> list[FakeHandle]:
        return [h for h in self.handles if not h.cancelled]

    def advance(self, to: float) -> None:
        while True:
            due = sorted((h for h in self.armed() if h.when <= to), key=lambda h: h.when)
            if not due:
                break
            self._run(due[0], due[0].when)
        self.now = to

    def due(self) -> float:
        """When the one armed timer is due."""
        (handle,) = self.armed()
        return handle.when

    def run_next(self, late: float = 0.0) -> None:
        """Run the one armed timer, `late` seconds after it was due."""
        (handle,) = self.armed()
        self._run(handle, handle.when + late)

    def _run(self, handle: FakeHandle, at: float) -> None:
        self.now = at
        handle.cancelled = True  # ran: no longer armed
        handle.callback(*handle.args)
