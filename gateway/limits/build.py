"""The limiter a gateway process runs, its store chosen by `[state] backend`: "sqlite" (this
process alone) keeps the counts in memory, "redis" shares them with the fleet. The Redis
module is imported only when chosen."""

from __future__ import annotations

from gateway.config.limits import LimitsConfig
from gateway.config.state import StateConfig
from gateway.limits.limiter import Limiter
from gateway.limits.memory import MemoryStore
from gateway.limits.store import Store


def build_limiter(limits: LimitsConfig, state: StateConfig, workers: int = 1) -> Limiter:
    """Call `start()` on it once the loop runs, and `close()` at shutdown. `workers`: the
    processes serving this replica's port; without a shared store each enforces its part of
    every limit (limit // workers), since their counts are not shared."""
    store: Store
    if state.backend == "redis":
        from gateway.limits.redis_store import RedisStore

        store = RedisStore.from_config(state, limits.slots_ttl)
        return Limiter(store, limits)
    store = MemoryStore(state.replica_name(), limits.slots_ttl)
    return Limiter(store, limits, ways=workers)
