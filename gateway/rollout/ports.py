"""What a rollout needs from the rest of the gateway, and what it answers with: the admin
service that drains units, the store that keeps its record (a SQLite file, or Redis shared by
replicas), and the errors it raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from gateway.units import UnitState


class LostLease(Exception):
    """Another process drives the shared rollout now: this one stops driving (and does not
    end it)."""


class Marks(Protocol):
    """The admin service: the rollout drains and re-enables units through it, so the
    operator's view, the events and the store see those as any other admin action."""

    async def set_state(self, unit_id: str, state: Any, reason: str, who: str) -> UnitState: ...

    async def busy(self, units: Sequence[UnitState]) -> list[str]:
        """The units with answers in flight (on any replica, where they share state)."""
        ...


class Kept(Protocol):
    """What the store read back holds of rollouts (gateway/admin/state.py's Saved)."""

    @property
    def rollouts(self) -> dict[str, dict[str, Any]]: ...

    @property
    def serving(self) -> dict[str, str]: ...


class Saver(Protocol):
    async def load(self) -> Kept: ...

    async def put_rollout(self, rollout: str, started: float, record: dict[str, Any]) -> None: ...

    async def set_serving(self, serving: dict[str, str]) -> None: ...


class Link(Saver, Protocol):
    """The rollout shared by replicas (gateway/admin/shared_rollouts.py). `load` gives the
    current record only; `put_rollout` and `set_serving` raise LostLease once another
    process holds the lease."""

    replica: str  # this replica's name in the fleet
    instance: str  # this process's, in the lease and the samples
    ttl: float  # seconds the lease lasts unless renewed

    async def history(self) -> list[dict[str, Any]]: ...

    async def acquire(self) -> bool: ...

    async def release(self) -> None: ...

    async def tick(
        self, windows: dict[str, Any] | None
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]: ...

    async def publish(self, windows: dict[str, Any]) -> None: ...

    async def clear_samples(self) -> None: ...

    async def command(self, verb: str, rollout: str, who: str) -> None: ...


class RolloutError(Exception):
    """Refused: `status` 400 (the ask is wrong, `field` names what), 404 or 409."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code
