"""Control API of the simulated units test tool: inspect units and inject faults over HTTP.

It is HTTP rather than in-process calls so that a test driving a separately started
simulator (or the gateway's end-to-end suite) can fault units the same way in-process
tests do.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson
from aiohttp import web

from loadtest.simunits.jsonhttp import json_response
from loadtest.simunits.params import ParamError, parse_fault, parse_node_health, parse_settings
from loadtest.simunits.unit import SimUnit


def _not_found(message: str) -> web.HTTPNotFound:
    text = orjson.dumps({"error": message}).decode()
    return web.HTTPNotFound(text=text, content_type="application/json")


def _bad_request(exc: ParamError) -> web.Response:
    return json_response({"error": str(exc), "field": exc.field}, 400)


class ControlApi:
    def __init__(self, units: Sequence[SimUnit]) -> None:
        self._units = {unit.id: unit for unit in units}

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/units", self.list_units),
            web.get("/units/{id}", self.get_unit),
            web.get("/units/{id}/stats", self.get_stats),
            web.post("/units/{id}/settings", self.post_settings),
            web.post("/units/{id}/fault", self.post_fault),
            web.post("/units/{id}/nodes/{rank}/health", self.post_health),
            web.post("/reset", self.post_reset),
        ]

    def _unit(self, request: web.Request) -> SimUnit:
        unit_id = request.match_info["id"]
        unit = self._units.get(unit_id)
        if unit is None:
            raise _not_found(f"unknown unit {unit_id!r}")
        return unit

    async def list_units(self, request: web.Request) -> web.Response:
        return json_response([unit.to_json() for unit in self._units.values()])

    async def get_unit(self, request: web.Request) -> web.Response:
        return json_response(self._unit(request).to_json())

    async def get_stats(self, request: web.Request) -> web.Response:
        return json_response(self._unit(request).state.stats.to_json())

    async def post_settings(self, request: web.Request) -> web.Response:
        unit = self._unit(request)
        try:
            unit.set_settings(parse_settings(await _body(request), unit.state.settings))
        except ParamError as exc:
            return _bad_request(exc)
        return json_response(unit.to_json())

    async def post_fault(self, request: web.Request) -> web.Response:
        unit = self._unit(request)
        try:
            fault = parse_fault(await _body(request))
        except ParamError as exc:
            return _bad_request(exc)
        try:
            await unit.set_fault(fault)
        except OSError as exc:
            return json_response({"error": f"cannot re-bind {unit.leader_url}: {exc}"}, 409)
        return json_response(unit.to_json())

    async def post_health(self, request: web.Request) -> web.Response:
        unit = self._unit(request)
        rank_text = request.match_info["rank"]
        rank = int(rank_text) if rank_text.isdigit() else -1
        if not 0 <= rank < len(unit.state.health):
            raise _not_found(f"unit {unit.id!r} has no rank {rank_text!r}")
        try:
            unit.set_health(rank, parse_node_health(await _body(request)))
        except ParamError as exc:
            return _bad_request(exc)
        return json_response(unit.to_json())

    async def post_reset(self, request: web.Request) -> web.Response:
        for unit in self._units.values():
            try:
                await unit.reset()
            except OSError as exc:
                return json_response({"error": f"cannot re-bind {unit.leader_url}: {exc}"}, 409)
        return json_response([unit.to_json() for unit in self._units.values()])


async def _body(request: web.Request) -> object:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ParamError("body", "is not valid JSON") from None
