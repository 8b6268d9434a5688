"""Client helpers for tests that drive the simulated units (a test tool) over HTTP.

The gateway's end-to-end tests need the same fault controls and SSE reading as this
package's own tests; sharing them keeps both suites honest about the wire contract.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import aiohttp
import orjson

JsonObject = dict[str, Any]


class ControlError(RuntimeError):
    def __init__(self, status: int, body: object) -> None:
        super().__init__(f"control API answered {status}: {body!r}")
        self.status = status
        self.body = body


async def sse_data(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """Yield each event's `data:` payload as it arrives; transport errors propagate."""
    async for line in response.content:
        if line.startswith(b"data: "):
            yield line[len(b"data: ") :].rstrip(b"\r\n")


def assemble_tool_calls(chunks: Iterable[Mapping[str, Any]]) -> list[JsonObject]:
    """Join the `delta.tool_calls` of streamed chat chunks into whole calls, by `index`.

    The result has the shape of a whole answer's `message.tool_calls`: id, type and name
    as the first delta of a call gives them, `arguments` as the join of every piece.
    """
    calls: dict[int, JsonObject] = {}
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            for delta in (choice.get("delta") or {}).get("tool_calls") or []:
                call = calls.setdefault(
                    delta["index"],
                    {"id": None, "type": None, "function": {"name": "", "arguments": ""}},
                )
                call["id"] = delta.get("id") or call["id"]
                call["type"] = delta.get("type") or call["type"]
                function = delta.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
    return [calls[index] for index in sorted(calls)]


class ControlClient:
    def __init__(self, session: aiohttp.ClientSession, control_url: str) -> None:
        self._session = session
        self._base = control_url.rstrip("/")

    async def _call(self, method: str, path: str, body: Mapping[str, object] | None = None) -> Any:
        data = None if body is None else orjson.dumps(body)
        async with self._session.request(method, self._base + path, data=data) as resp:
            payload = orjson.loads(await resp.read())
            if resp.status >= 400:
                raise ControlError(resp.status, payload)
            return payload

    async def units(self) -> list[JsonObject]:
        result: list[JsonObject] = await self._call("GET", "/units")
        return result

    async def stats(self, unit_id: str) -> JsonObject:
        result: JsonObject = await self._call("GET", f"/units/{unit_id}/stats")
        return result

    async def settings(self, unit_id: str, **values: float | str) -> JsonObject:
        """E.g. `settings("u0", ttft_ms=320, tools="bad_json", variant="r2")`."""
        result: JsonObject = await self._call("POST", f"/units/{unit_id}/settings", values)
        return result

    async def fault(self, unit_id: str, mode: str, **params: object) -> JsonObject:
        """E.g. `fault("u0", "drop", after_tokens=3, rate=0.05, seed=7)`."""
        result: JsonObject = await self._call(
            "POST", f"/units/{unit_id}/fault", {"mode": mode, **params}
        )
        return result

    async def node_health(self, unit_id: str, rank: int, mode: str, **params: float) -> JsonObject:
        path = f"/units/{unit_id}/nodes/{rank}/health"
        result: JsonObject = await self._call("POST", path, {"mode": mode, **params})
        return result

    async def reset(self) -> None:
        await self._call("POST", "/reset")

    async def wait_stats(
        self, unit_id: str, predicate: Callable[[JsonObject], bool], within_s: float = 5.0
    ) -> JsonObject:
        """Poll until `predicate(stats)` holds; a deadline, not a sleep, bounds the wait."""
        deadline = time.monotonic() + within_s
        while True:
            stats = await self.stats(unit_id)
            if predicate(stats):
                return stats
            if time.monotonic() > deadline:
                raise TimeoutError(f"stats of {unit_id} never matched: {stats}")
            await asyncio.sleep(0.01)
