"""The chaos suite's view of a gateway's operator listener: metrics samples, the resumption
counters, the in-flight gauges and the admin events log, read with bounded polls."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass
class Ops:
    """/metrics and /admin of one gateway (the operator listener)."""

    url: str
    token: str | None = None

    def _get(self, path: str, timeout: float = 5.0) -> bytes:
        req = urllib.request.Request(self.url + path)
        if self.token is not None:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body: bytes = resp.read()
            return body

    def admin(self, path: str, body: dict[str, Any] | None = None) -> Any:
        req = urllib.request.Request(self.url + path, data=orjson.dumps(body or {}), method="POST")
        req.add_header("Content-Type", "application/json")
        if self.token is not None:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=5) as resp:
            return orjson.loads(resp.read())

    def unit(self, unit_id: str) -> dict[str, Any]:
        doc: dict[str, Any] = orjson.loads(self._get(f"/admin/units/{unit_id}"))
        return doc

    def units(self) -> list[dict[str, Any]]:
        doc: dict[str, Any] = orjson.loads(self._get("/admin/units"))
        return list(doc["units"])

    def events(self, unit: str | None = None) -> list[dict[str, Any]]:
        query = "?limit=10000" + (f"&unit={unit}" if unit else "")
        doc: dict[str, Any] = orjson.loads(self._get("/admin/events" + query))
        return list(doc["events"])

    def metrics(self) -> str:
        return self._get("/metrics").decode()

    def gauges(self, name: str) -> dict[str, float]:
        """Every sample of one gauge, keyed by its label text."""
        return samples(self.metrics(), name)

    def counter(self, name: str) -> float:
        return sum(samples(self.metrics(), name).values())


def resumptions(ops: Ops) -> dict[str, float]:
    """`unitgate_resumptions_total` summed over units, by outcome ({} before resumption)."""
    out: dict[str, float] = {}
    for labels, value in samples(ops.metrics(), "unitgate_resumptions_total").items():
        match = re.search(r'outcome="([^"]*)"', labels)
        outcome = match.group(1) if match else "?"
        out[outcome] = out.get(outcome, 0.0) + value
    return out


def samples(text: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key[len(name) :]] = float(value)
    return out


async def until(check: Callable[[], object], within: float, what: str, step: float = 0.05) -> Any:
    """Poll `check` (sync; run in a thread) until truthy, failing at the deadline."""
    deadline = time.monotonic() + within
    last: object = None
    while True:
        try:
            result = await asyncio.to_thread(check)
            if result:
                return result
        except Exception as exc:  # keep polling; the last failure goes in the message
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within} s (last: {last!r})")
        await asyncio.sleep(step)


async def gauges_back_to_zero(ops: Ops, within: float = 10.0) -> dict[str, float]:
    """Waits for every unit's in-flight gauge and the queue depth to be 0; returns them."""

    def zero() -> dict[str, float]:
        text = ops.metrics()
        values = samples(text, "unitgate_unit_inflight") | samples(text, "unitgate_queue_depth")
        if not values or any(values.values()):
            raise AssertionError(f"gauges {values}")  # until() reports the last one
        return values

    result: dict[str, float] = await until(zero, within, "in-flight gauges back to 0")
    return result


def first_event_after(
    ops: Ops, unit: str, what: Iterable[str], after_wall: float
) -> dict[str, Any] | None:
    kinds = set(what)
    for event in ops.events(unit):
        if event["what"] in kinds and event["time"] >= after_wall:
            return event
    return None


async def ejection_time(
    ops: Ops, unit: str, after_wall: float, within: float = 10.0
) -> tuple[float, str]:
    """Seconds from the fault until the gateway took `unit` out (health or breaker event),
    and the event's reason."""
    event = await until(
        lambda: first_event_after(ops, unit, ("unhealthy", "ejected"), after_wall),
        within,
        f"unit {unit} ejected",
    )
    return event["time"] - after_wall, f"{event['what']}: {event['reason']}"
