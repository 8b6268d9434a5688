"""Keeps each conversation turn's prompt ids, as its unit reported them, for the next turn
(gateway/kvevents/turns.py): a subscriber of the request path's signals, at the request's end."""

from __future__ import annotations

from typing import Protocol

from gateway.kvevents.turns import Turns
from gateway.relay.tracker import StreamTracker
from gateway.signals import Observer


class Call(Protocol):
    """What the feed reads of the request path's Call (proxy/call.py)."""

    @property
    def turn(self) -> bytes | None: ...

    @property
    def tracker(self) -> StreamTracker | None: ...

    @property
    def status(self) -> int | None: ...


class TurnsFeed(Observer[Call]):
    def __init__(self, turns: Turns) -> None:
        self.turns = turns

    def ended(self, call: Call) -> None:
        tracker = call.tracker
        if call.turn is None or tracker is None or call.status != 200:
            return
        if tracker.prompt_ids is not None:  # what the unit computed: its cache holds them
            self.turns.put(call.turn, tracker.prompt_ids)
