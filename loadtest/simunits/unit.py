"""A running simulated unit (test tool): its state, its token pacing and its listeners.

The unit is where the "engine" lives: every token of every stream passes through `emit`,
which is what lets a stall freeze the whole unit, as a hung collective would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from loadtest.simunits.listener import Listener
from loadtest.simunits.state import Fault, FaultMode, NodeHealth, Settings, UnitState
from loadtest.simunits.topology import UnitSpec


async def wait_forever() -> None:
    """Park a request until its client goes away or the simulator shuts down."""
    await asyncio.get_running_loop().create_future()


class SimUnit:
    def __init__(self, unit_id: str, node_count: int, defaults: Settings) -> None:
        self.state = UnitState.new(unit_id, node_count, defaults)
        self._running = asyncio.Event()
        self._running.set()
        self._stalled = 0
        self._fault_lock = asyncio.Lock()
        self._spec: UnitSpec | None = None
        self._api: Listener | None = None
        self._nodes: list[Listener | None] = []

    @property
    def id(self) -> str:
        return self.state.unit_id

    def attach(
        self, spec: UnitSpec, api: Listener | None, nodes: Sequence[Listener | None]
    ) -> None:
        """Called by the cluster once listeners are bound, so URLs carry the real ports.

        `None` stands for the API or a node that another simulator process serves (see
        `--nodes`): its URL is then the configured one.
        """
        self._spec = spec
        self._api = api
        self._nodes = list(nodes)

    @property
    def leader_url(self) -> str:
        assert self._spec is not None, "unit not started"
        return self._api.url if self._api is not None else self._spec.leader.url()

    @property
    def node_urls(self) -> list[str]:
        assert self._spec is not None, "unit not started"
        return [
            node.url if node is not None else address.url()
            for node, address in zip(self._nodes, self._spec.nodes, strict=True)
        ]

    @property
    def served_ranks(self) -> list[int]:
        """Ranks whose /health this process answers."""
        return [rank for rank, node in enumerate(self._nodes) if node is not None]

    async def emit(self, index: int, settings: Settings, stall_ms: float = 0.0) -> None:
        """Produce token `index`: wait its latency (the first: `stall_ms` more), then one
        engine step."""
        delay_ms = settings.ttft_ms + stall_ms if index == 0 else settings.itl_ms
        await asyncio.sleep(delay_ms / 1000)
        if not self._running.is_set():
            await self._running.wait()
        self.state.stats.step += 1

    async def stall_forever(self) -> None:
        """Freeze every stream of the unit (and its step) until this request's client leaves.

        Clearing the fault does not unfreeze: a hung collective does not recover on its
        own, so the gateway has to cancel the request for the unit to move again.
        """
        self._stalled += 1
        self._running.clear()
        try:
            await wait_forever()
        finally:
            self._stalled -= 1
            if not self._stalled:
                self._running.set()

    async def set_fault(self, fault: Fault) -> None:
        async with self._fault_lock:
            # Without the API here (a followers-only process) a fault is recorded, not felt.
            if fault.mode is FaultMode.REFUSE:
                self.state.set_fault(fault)
                if self._api is not None:
                    await self._api.close_socket()
            else:
                if self._api is not None:
                    await self._api.open()
                self.state.set_fault(fault)

    def set_settings(self, settings: Settings) -> None:
        self.state.settings = settings

    def set_health(self, rank: int, health: NodeHealth) -> None:
        self.state.health[rank] = health

    async def reset(self) -> None:
        async with self._fault_lock:
            if self._api is not None:
                await self._api.open()
            self.state.reset()

    def to_json(self) -> dict[str, object]:
        state = self.state
        return {
            "id": self.id,
            "leader": self.leader_url,
            "nodes": self.node_urls,
            "ranks": self.served_ranks,
            "settings": state.settings.to_json(),
            "fault": state.fault.to_json(),
            "health": [{"rank": r, **h.to_json()} for r, h in enumerate(state.health)],
            "stats": state.stats.to_json(),
        }
