"""Prefix cache counters, as vLLM counts them (v1/metrics/stats.py, PrefixCacheStats).

In tokens, from the first request on (Prometheus counters: `vllm:prefix_cache_queries` and
`vllm:prefix_cache_hits` export `queries` and `hits`). A request's whole prompt is queried
and its cached prefix hit; a preempted request's recompute is counted apart, as vLLM does,
so that a unit thrashing under memory pressure does not look like one with a warm cache.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    requests: int = 0
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of which found cached
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, queries: int, hits: int, preempted: bool) -> PrefixCacheStats:
        if preempted:
            return replace(
                self,
                preempted_requests=self.preempted_requests + 1,
                preempted_queries=self.preempted_queries + queries,
                preempted_hits=self.preempted_hits + hits,
            )
        return replace(
            self, requests=self.requests + 1, queries=self.queries + queries, hits=self.hits + hits
        )

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0
