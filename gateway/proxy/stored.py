"""Stored responses: a request about a response goes to the unit that holds it.

A stock vLLM keeps the responses it stores in its own memory (run with
`VLLM_ENABLE_RESPONSES_API_STORE=1`), so `GET /v1/responses/{id}`, `POST
/v1/responses/{id}/cancel` and a new response with `previous_response_id` can only be answered
by the unit that made the response. Each `/v1/responses` answer teaches this process which unit
holds its id (routing/homes.py: bounded, expiring). An id this process has not seen (made
through another worker or replica, or before a restart) is looked for on the units: a
`GET /v1/responses/{id}` to each unit of the model that serves the API, at once, under the
first-byte timeout; the one that answers 200 is its home from then on. That costs one small
read per unit the first time a process meets an id, and never a shared store on the request
path. An id no unit holds is vLLM's own 404; one whose unit has left the fleet, a 404 that
says so.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import quote

import orjson

from gateway.config import Config
from gateway.errors import InvalidRequest, Overloaded, UpstreamError
from gateway.paths import RESPONSES_PATH
from gateway.proxy.upstream import Answer, UpstreamClient
from gateway.routing.homes import Homes
from gateway.units import UnitRegistry, UnitState

log = logging.getLogger("unitgate.proxy")


def response_id(first: bytes, content_type: str) -> str | None:
    """The id a Responses answer carries: a whole response's `id`, or a stream's first event
    (`response.created`, whose `response` is the response). None when it is not there."""
    try:
        if content_type.startswith("text/event-stream"):
            start = first.find(b"data:")
            if start < 0:
                return None
            end = first.find(b"\n", start)
            event = orjson.loads(first[start + 5 : end if end >= 0 else len(first)])
            found = event.get("response", {}).get("id") if isinstance(event, dict) else None
        else:
            whole = orjson.loads(first)
            found = whole.get("id") if isinstance(whole, dict) else None
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return found if isinstance(found, str) and found else None


def not_found(response_id: str, why: str = "") -> InvalidRequest:
    """vLLM's own answer for an id it does not hold (and the gateway's, with the reason)."""
    message = f"Response with id '{response_id}' not found." + (f" {why}" if why else "")
    return InvalidRequest(message, status=404, param="response_id")


def target(response_id: str, tail: str = "", query: str = "") -> str:
    """The path on the unit: the id quoted as one path segment, the client's query kept."""
    path = f"{RESPONSES_PATH}/{quote(response_id, safe='')}{tail}"
    return f"{path}?{query}" if query else path


class StoredResponses:
    def __init__(self, config: Config, units: UnitRegistry, upstream: UpstreamClient) -> None:
        r = config.routing
        self.homes: Homes[UnitState] = Homes(r.stored_responses, r.stored_response_ttl)
        self.units = units
        self.upstream = upstream
        self.first_byte = config.timeouts.first_byte

    def learn(self, answer: Answer, unit: UnitState) -> None:
        """A `/v1/responses` answer of `unit` (status 200): its response is held there."""
        found = response_id(answer.first, answer.content_type)
        if found is not None:
            self.homes.learn(found, unit, asyncio.get_running_loop().time())

    async def home(self, response_id: str, model: str | None, rid: str) -> UnitState:
        """The unit that holds `response_id` (of `model`, if known)."""
        now = asyncio.get_running_loop().time()
        unit = self.homes.get(response_id, now)
        if unit is None:
            unit = await self._locate(response_id, model, rid)
            self.homes.learn(response_id, unit, now)
        if self.units.units.get(unit.id) is not unit:
            raise not_found(response_id, f"Unit '{unit.id}', which stored it, has left the fleet.")
        return unit

    async def _locate(self, response_id: str, model: str | None, rid: str) -> UnitState:
        units = [
            u
            for u in self.units.units.values()
            if u.healthy and RESPONSES_PATH in u.serves and (model is None or model in u.models)
        ]
        if not units:
            raise not_found(response_id, "No unit that serves the Responses API is up.")
        deadline = asyncio.get_running_loop().time() + self.first_byte
        tasks = [asyncio.ensure_future(self._holds(u, response_id, rid, deadline)) for u in units]
        unsure = 0
        try:
            for done in asyncio.as_completed(tasks):
                unit, held = await done
                if held:
                    return unit
                unsure += held is None
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if unsure:
            raise Overloaded(
                f"could not look for response '{response_id}': {unsure} of {len(units)} "
                "units did not answer in time",
                status=503,
                code="no_routable_unit",
                retry_after=1,
            )
        raise not_found(response_id)

    async def _holds(
        self, unit: UnitState, response_id: str, rid: str, deadline: float
    ) -> tuple[UnitState, bool | None]:
        """Whether `unit` holds the response (None: it could not tell, in time or at all)."""
        try:
            status, _ = await self.upstream.get(
                unit.id,
                unit.leader,
                target(response_id),
                rid,
                deadline,
                unit.extra_head,
                unit.config,
            )
        except UpstreamError as exc:
            log.info("looking for response %s on unit %s: %s", response_id, unit.id, exc.detail)
            return unit, None
        return unit, status == 200
