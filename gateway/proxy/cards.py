"""What the units say about themselves: their model cards (`GET /v1/models`) and their vLLM
version (`GET /version`), read from the units when a client asks and kept for a while.

`/v1/models` lists the gateway's public model ids, each with the card a unit of it reports
(`root`, `max_model_len`, `owned_by`, ... as vLLM writes them), its `id` the public one. A
card is read again once it is `FRESH_S` old, from a healthy unit of the model; while no unit of
a model is up, the last card read is shown, and a model never read yet shows the gateway's own
bare card (`id`, `object`, `created`, `owned_by: "unitgate"`).

`/version` answers vLLM's shape, `{"version": ...}`: the units' vLLM version when they agree,
the oldest when they differ (a client that detects features by it then uses only what every
unit has), null when no unit reports one (the builtin engine does not); beside it the
gateway's own (`unitgate`) and each unit's (`units`).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from gateway.config import Config
from gateway.errors import UpstreamError
from gateway.proxy.upstream import UpstreamClient
from gateway.units import UnitRegistry, UnitState
from gateway.version import version as own_version

FRESH_S = 30.0  # a card or a version this old is read again when asked for
READ_S = 1.0  # the longest a client waits for the units' answers (then: what is known)
Card = dict[str, Any]


class UnitCards:
    def __init__(self, config: Config, units: UnitRegistry, upstream: UpstreamClient) -> None:
        self.models = config.gateway.models
        self.units = units
        self.upstream = upstream
        self.created = int(time.time())
        self._cards: dict[str, tuple[Card, float]] = {}  # public id -> (card, read at)
        self._versions: dict[str, tuple[str | None, float]] = {}  # unit id -> (version, at)
        self._lock = asyncio.Lock()  # one reading at a time; the others find it fresh

    def bare(self, model: str) -> Card:
        return {"id": model, "object": "model", "created": self.created, "owned_by": "unitgate"}

    def card(self, model: str) -> Card:
        known = self._cards.get(model)
        return dict(known[0]) if known is not None else self.bare(model)

    async def listed(self) -> list[Card]:
        """Every public model's card, read from the units where it is stale."""
        now = asyncio.get_running_loop().time()
        stale = [m for m in self.models if now - self._cards.get(m, ({}, -FRESH_S))[1] >= FRESH_S]
        if stale:
            async with self._lock:
                await self._read(stale, self._read_card)
        return [self.card(m) for m in self.models]

    async def version(self) -> dict[str, Any]:
        now = asyncio.get_running_loop().time()
        units = [u for u in self.units.units.values() if u.healthy]
        stale = [
            u.id for u in units if now - self._versions.get(u.id, (None, -FRESH_S))[1] >= FRESH_S
        ]
        if stale:
            async with self._lock:
                await self._read(stale, self._read_version)
        versions = {u.id: self._versions.get(u.id, (None, 0.0))[0] for u in units}
        reported = sorted({v for v in versions.values() if v is not None}, key=_release)
        return {
            "version": reported[0] if reported else None,
            "unitgate": own_version(),
            "units": versions,
        }

    async def _read(self, keys: list[str], read: Callable[[str], Awaitable[None]]) -> None:
        """Read each key at once, all within READ_S; what did not come in time stays as it was."""
        tasks = [asyncio.ensure_future(read(k)) for k in keys]
        try:
            await asyncio.wait(tasks, timeout=READ_S)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _read_card(self, model: str) -> None:
        units = [u for u in self.units.units.values() if model in u.models and u.healthy]
        units.sort(key=lambda u: not u.routable)
        for unit in units[:2]:
            listed = await self._get(unit, "/v1/models")
            cards = listed.get("data") if isinstance(listed, dict) else None
            if not isinstance(cards, list):
                continue
            want = unit.config.served_model or model
            mine = [c for c in cards if isinstance(c, dict) and c.get("id") == want]
            if not mine and len(cards) == 1 and isinstance(cards[0], dict):
                mine = cards  # a unit serving one model under its own name
            if mine:
                card = {**mine[0], "id": model}
                self._cards[model] = (card, asyncio.get_running_loop().time())
                return

    async def _read_version(self, unit_id: str) -> None:
        unit = self.units.units.get(unit_id)
        if unit is None:
            return
        said = await self._get(unit, "/version")
        found = said.get("version") if isinstance(said, dict) else None
        read = found if isinstance(found, str) else None
        self._versions[unit_id] = (read, asyncio.get_running_loop().time())

    async def _get(self, unit: UnitState, path: str) -> Any:
        """The JSON a unit answers a GET of `path` with (None: any failure, or not 200)."""
        deadline = asyncio.get_running_loop().time() + READ_S
        try:
            status, body = await self.upstream.get(
                unit.id, unit.leader, path, "unitgate-cards", deadline, unit.extra_head, unit.config
            )
        except UpstreamError:
            return None
        if status != 200 or body is None:  # not 200, or a stream: not what was asked for
            return None
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            return None


def _release(version: str) -> tuple[int, ...]:
    """ "0.32.0" -> (0, 32, 0); a suffix (".dev3+g1234", "rc1") does not count."""
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+", maxsplit=1)[0])[:3])
