"""The limiter a gateway process runs, its store chosen by `[state] backend`: "sqlite" (this
process alone) keeps the counts in memory, "redis" shares them with the fleet. The Redis
module is imported only when chosen."""

from __future__ import annotations

from collections.abc import Callable

from gateway.config.limits import LimitsConfig
from gateway.config.state import StateConfig
from gateway.limits.limiter import Limiter
from gateway.limits.memory import MemoryStore
from gateway.limits.store import Store


def build_limiter(
    limits: LimitsConfig, state: StateConfig, live_replicas: Callable[[], int] = lambda: 1
) -> Limiter:
    """Call `start()` on it once the loop runs, and `close()` at shutdown."""
    store: Store
    if state.backend == "redis":
        from gateway.limits.redis_store import RedisStore

        store = RedisStore.from_config(state, limits.slots_ttl)
    else:
        store = MemoryStore(state.replica_name(), limits.slots_ttl)
        live_replicas = _alone
    return Limiter(store, limits, live_replicas=live_replicas)


def _alone() -> int:
    return 1  # the memory store is this process's: its share is the whole limit
