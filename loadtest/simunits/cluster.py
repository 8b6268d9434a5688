"""SimCluster: the simulated units test tool's whole process, usable in-process by tests.

Owning every listener in one object gives tests and the CLI the same start/stop path, so
what the gateway's tests run against is exactly what `unitgate sim` runs.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Collection, Sequence
from types import TracebackType

from aiohttp import web

from loadtest.simunits.control import ControlApi
from loadtest.simunits.health import NodeHealthApi
from loadtest.simunits.leader import LeaderApi, ServeConfig
from loadtest.simunits.listener import Listener
from loadtest.simunits.openai_format import PROCESS_CREATED
from loadtest.simunits.state import Settings
from loadtest.simunits.topology import Address, UnitSpec, generated_units
from loadtest.simunits.unit import SimUnit

DEFAULT_MODEL = "unitgate-sim"
DEFAULT_MAX_TOKENS_CAP = 4096


class SimCluster:
    """Simulated units plus their control API; `specs` overrides `units`/`followers`/`host`.

    `serve` limits this process to some (unit id, rank) nodes, so that one node of a unit can
    run in a process of its own and be killed or frozen alone; units with no node listed are
    not run at all. The leader's API runs where rank 0 does.
    """

    def __init__(
        self,
        units: int = 2,
        followers: int = 1,
        *,
        host: str = "127.0.0.1",
        specs: Sequence[UnitSpec] | None = None,
        settings: Settings | None = None,
        model: str = DEFAULT_MODEL,
        max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP,
        control_host: str = "127.0.0.1",
        control_port: int = 0,
        serve: Collection[tuple[str, int]] | None = None,
    ) -> None:
        self._specs = list(specs) if specs is not None else generated_units(units, followers, host)
        self._serve_only = None if serve is None else frozenset(serve)
        self._settings = settings or Settings()
        self._serve = ServeConfig(model, max_tokens_cap, PROCESS_CREATED, itertools.count())
        self._control_address = Address(control_host, control_port)
        self._control: Listener | None = None
        self._listeners: list[Listener] = []
        self.units: list[SimUnit] = []

    @property
    def control_url(self) -> str:
        assert self._control is not None, "cluster not started"
        return self._control.url

    def unit(self, unit_id: str) -> SimUnit:
        for unit in self.units:
            if unit.id == unit_id:
                return unit
        raise KeyError(unit_id)

    def describe(self) -> dict[str, object]:
        """The topology as bound, in the shape of the CLI's ready file (minus the pid)."""
        units = [
            {"id": u.id, "leader": u.leader_url, "nodes": u.node_urls, "ranks": u.served_ranks}
            for u in self.units
        ]
        return {"control": self.control_url, "units": units}

    async def start(self) -> None:
        try:
            for spec in self._specs:
                ranks = self._ranks(spec)
                if ranks:
                    self.units.append(await self._start_unit(spec, ranks))
            self._control = await self._listen(
                self._control_address, ControlApi(self.units).routes()
            )
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop accepting everywhere first, then cancel what is still running."""
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            await listener.close_socket()
        await asyncio.gather(*(listener.stop() for listener in listeners))

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _ranks(self, spec: UnitSpec) -> frozenset[int]:
        every = frozenset(range(len(spec.nodes)))
        if self._serve_only is None:
            return every
        return frozenset(r for r in every if (spec.id, r) in self._serve_only)

    async def _start_unit(self, spec: UnitSpec, ranks: frozenset[int]) -> SimUnit:
        unit = SimUnit(spec.id, len(spec.nodes), self._settings)
        api_routes = LeaderApi(unit, self._serve).routes()
        nodes: list[Listener | None] = []
        for rank, address in enumerate(spec.nodes):
            if rank not in ranks:
                nodes.append(None)  # served by another simulator process
                continue
            routes = NodeHealthApi(unit, rank).routes()
            if rank == 0 and spec.leader_shares_rank0:
                routes += api_routes
            nodes.append(await self._listen(address, routes))
        api = nodes[0]
        if api is not None and not spec.leader_shares_rank0:
            # The leader's own address also answers /health, as rank 0, for probes sent there.
            api = await self._listen(spec.leader, api_routes + NodeHealthApi(unit, 0).routes())
        unit.attach(spec, api, nodes)
        return unit

    async def _listen(self, address: Address, routes: list[web.RouteDef]) -> Listener:
        listener = Listener(address, routes)
        await listener.start()
        self._listeners.append(listener)
        return listener
