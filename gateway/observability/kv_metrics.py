"""The KV event subscribers' and the KV index's figures, read at scrape time from what they
already count (gateway/kvevents): nothing is updated per batch for the metrics' sake."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class SubscriberView(Protocol):
    @property
    def trusted(self) -> bool: ...

    @property
    def batches(self) -> int: ...

    @property
    def garbage(self) -> int: ...

    @property
    def replays(self) -> int: ...

    @property
    def dropped(self) -> int: ...

    @property
    def foreign(self) -> int: ...


class KvView(Protocol):
    def subscribers(self) -> Mapping[str, SubscriberView]: ...

    def index_size(self) -> tuple[int, int]:
        """(blocks held, stored blocks skipped since start: their parent was unknown)."""
        ...


COUNTERS = (
    ("batches", "unitgate_kv_events_batches", "KV event batches applied to the index, by unit."),
    (
        "garbage",
        "unitgate_kv_events_bad_frames",
        "KV event frames that were not vLLM's format, by unit (the unit is routed approximately"
        " until its next good batch).",
    ),
    (
        "replays",
        "unitgate_kv_events_replays",
        "Replays asked of a unit's publisher (on connecting, a gap, or a quiet poll).",
    ),
    (
        "dropped",
        "unitgate_kv_events_drops",
        "Times a unit's index entries were dropped: a restarted engine, or batches lost that"
        " its publisher no longer kept.",
    ),
    (
        "foreign",
        "unitgate_kv_events_foreign_batches",
        "KV event batches of another model than the unit's (token ids past its tokenizer's"
        " vocabulary), not applied: the unit is routed approximately until a batch of its own.",
    ),
)


class TurnsView(Protocol):
    """Conversations' kept turns (gateway/kvevents/turns.py)."""

    @property
    def tokens(self) -> int: ...

    @property
    def hits(self) -> int: ...

    @property
    def misses(self) -> int: ...

    def __len__(self) -> int: ...


class KvCollector(Collector):
    def __init__(
        self,
        view: Callable[[], KvView | None],
        turns: Callable[[], TurnsView | None] = lambda: None,
    ) -> None:
        self.view, self.turns = view, turns

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        view = self.view()
        subscribers = view.subscribers() if view is not None else {}
        trusted = GaugeMetricFamily(
            "unitgate_kv_events_trusted",
            "1 while a unit's KV events are read and complete (its cached prefixes route"
            " requests), 0 while it is routed approximately.",
            labels=["unit"],
        )
        for unit, sub in subscribers.items():
            trusted.add_metric([unit], 1.0 if sub.trusted else 0.0)
        yield trusted
        for attribute, name, doc in COUNTERS:
            family = CounterMetricFamily(name, doc, labels=["unit"])
            for unit, sub in subscribers.items():
                family.add_metric([unit], float(getattr(sub, attribute)))
            yield family
        blocks, orphans = view.index_size() if view is not None else (0, 0)
        yield GaugeMetricFamily(
            "unitgate_kv_index_blocks",
            "Blocks the KV index holds (at most [routing].kv_index_blocks).",
            value=blocks,
        )
        yield CounterMetricFamily(
            "unitgate_kv_index_orphans",
            "Stored blocks the KV index skipped: their parent block was not known (an event"
            " missed, or evicted from the index).",
            value=orphans,
        )
        turns = self.turns()
        if turns is None:
            return
        yield GaugeMetricFamily(
            "unitgate_conversation_turns",
            "Conversations whose last turn's prompt ids are kept, for routing their next turn"
            " where the model has no tokenizer here.",
            value=len(turns),
        )
        yield GaugeMetricFamily(
            "unitgate_conversation_tokens",
            "Prompt ids those turns hold (at most [routing].conversation_tokens).",
            value=turns.tokens,
        )
        lookups = CounterMetricFamily(
            "unitgate_conversation_lookups",
            "Next turns looked up among the kept ones: `hit` (its start is known) or `miss`.",
            labels=["result"],
        )
        lookups.add_metric(["hit"], turns.hits)
        lookups.add_metric(["miss"], turns.misses)
        yield lookups
