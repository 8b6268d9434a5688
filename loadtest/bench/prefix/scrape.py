"""What the benchmark reads from Prometheus text: each vLLM server's prefix cache counters and
cache size, and the precise gateway's KV event and index figures (gateway/observability/
kv_metrics.py). Pure: the text is fetched elsewhere."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

# vLLM 0.32's counters, in prompt tokens: looked up for each new request, found cached.
HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
CACHE_INFO = "vllm:cache_config_info"
# The gateway's, by unit where they have one; blocks and orphans are the index's.
KV_COUNTERS = {
    "batches": "unitgate_kv_events_batches_total",
    "replays": "unitgate_kv_events_replays_total",
    "drops": "unitgate_kv_events_drops_total",
    "bad_frames": "unitgate_kv_events_bad_frames_total",
    "orphans": "unitgate_kv_index_orphans_total",
}
# How the gateway's predictions of each request's cached tokens compared with the server's
# own count (`cached_tokens`, with --enable-prompt-tokens-details), by outcome.
PREDICTIONS = "unitgate_prefix_predictions_total"
OUTCOMES = ("exact", "over", "under")
KV_BLOCKS = "unitgate_kv_index_blocks"
KV_TRUSTED = "unitgate_kv_events_trusted"


def _samples(text: str) -> Iterator[Sample]:
    for family in text_string_to_metric_families(text):
        yield from family.samples


def total(text: str, name: str, **labels: str) -> float:
    """The sum of a sample's values over all its label sets (a server's engines; units), or
    over those with `labels`."""
    return sum(
        s.value
        for s in _samples(text)
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


@dataclass(frozen=True, slots=True)
class Cache:
    """A server's prefix cache counters, in prompt tokens."""

    hits: float
    queries: float

    def __sub__(self, before: Cache) -> Cache:
        return Cache(self.hits - before.hits, self.queries - before.queries)


def cache(text: str) -> Cache:
    return Cache(total(text, HITS), total(text, QUERIES))


def cache_info(text: str) -> dict[str, str]:
    """The labels of `vllm:cache_config_info` (its CacheConfig: num_gpu_blocks, block_size)."""
    for sample in _samples(text):
        if sample.name == CACHE_INFO:
            return dict(sample.labels)
    return {}


def hit_rate(deltas: Mapping[str, Cache]) -> float:
    """The fleet's: all servers' hits over all their queries."""
    queries = sum(d.queries for d in deltas.values())
    return sum(d.hits for d in deltas.values()) / queries if queries else float("nan")


def busiest_share(deltas: Mapping[str, Cache]) -> float:
    """The most prompt tokens one server was asked for, as a share of all: 1 / servers when
    the load was even, 1.0 when one server took everything."""
    queries = sum(d.queries for d in deltas.values())
    return max(d.queries for d in deltas.values()) / queries if queries else float("nan")


def kv_figures(text: str) -> dict[str, float]:
    """The gateway's KV counters (summed over units), its index's size and trusted units."""
    figures = {key: total(text, name) for key, name in KV_COUNTERS.items()}
    figures |= {f"predicted_{o}": total(text, PREDICTIONS, outcome=o) for o in OUTCOMES}
    figures["index_blocks"] = total(text, KV_BLOCKS)
    figures["trusted_units"] = total(text, KV_TRUSTED)
    return figures


def kv_deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Counters over a window; the index's size and trust as they stand at its end."""
    counters = {*KV_COUNTERS, *(f"predicted_{o}" for o in OUTCOMES)}
    return {key: after[key] - before[key] if key in counters else after[key] for key in after}
