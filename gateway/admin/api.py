"""The admin API: look at units, take them out of service and back, add and remove them.

It is served on the operator listener (`[metrics]` host and port, next to `/metrics`), under
`/admin/`, and only when `[admin].enabled`. Bodies and answers are JSON.

Authentication: `Authorization: Bearer <token>`. The token comes from the env var named by
`[admin].token_env` (default UNITGATE_ADMIN_TOKEN), else the first line of `[admin].token_file`;
it is one bare token (named "admin") or `name:token,name:token` so the events log shows who
acted. No or malformed header: 401 with `WWW-Authenticate: Bearer`; wrong token: 403. Without
a token the gateway refuses to start, unless `allow_unauthenticated_loopback = true` and the
operator listener is on loopback (then no auth, `who` = "local"). `/metrics` never needs auth.

Errors: `{"error": {"message", "type", "param", "code"}}`, as on the public API: 400 bad body
or query (the message names the key), 401/403 auth, 404 unknown unit, 409 unit id taken, 500
state file not writable (the action is then not applied).

    GET    /admin/units                 -> 200 {"units": [UNIT, ...], "panic": {MODEL: WHY}}
    GET    /admin/units/{id}            -> 200 UNIT
    POST   /admin/units/{id}/disable    {"reason": "..."} (required)              -> 200 UNIT
    POST   /admin/units/{id}/drain      {"reason": "..."} (optional, or no body)  -> 200 UNIT
    POST   /admin/units/{id}/enable     {"reason": "..."} (optional, or no body)  -> 200 UNIT
    POST   /admin/units                 {"id", "leader", "nodes"?, "weight"?, "max_inflight"?,
                                         "models"?, "enabled"?, "cell"?,
                                         "revision"?}                             -> 201 UNIT
    DELETE /admin/units/{id}            -> 200 {"id", "removed": true, "in_flight"}
    GET    /admin/events?limit=N&unit=ID  (limit default 100) -> 200 {"events": [EVENT, ...]}
    POST   /admin/keys, GET /admin/keys, DELETE /admin/keys/{id}: data-plane API keys (keys.py)
    POST   /admin/rollouts              {"to", "from"?, "cells"?, "steps"?, "step_seconds"?,
                                         "gates"?, "golden"?, "hooks"?, ...}        -> 201 ROLLOUT
    GET    /admin/rollouts              -> 200 {"rollouts": [ROLLOUT, ...]}  (newest first)
    GET    /admin/rollouts/current      -> 200 ROLLOUT (404: none has run)
    POST   /admin/rollouts/current/pause | resume | abort                 -> 200 ROLLOUT
    GET    /admin/rollouts/current/verdict -> 200 {"id", "state", "verdict", "gates", "reason"}
    GET    /admin/openapi.json          -> 200 this API in OpenAPI 3.1 (no token needed)

    UNIT = {"id", "routable",            # true when health, breaker and admin all allow it
            "health": {"healthy", "reason"},                      # the prober's verdict
            "breaker": {"state": "admitting"|"ejected"|..., ...}, # the circuit breaker's
            "admin": {"state": "enabled"|"disabled"|"draining"|"drained",
                      "reason", "who", "since"},                  # the operator's; since = Unix s
            "in_flight", "drained",      # drained: out of service by the admin, 0 in flight
            "cell", "revision", "idle",  # idle: why its revision gets no traffic ("" = it does)
            "leader", "weight", "cap", "models",
            "nodes": [{"url", "role", "rank", "healthy", "latency_ms", "error"}]}
    EVENT = {"time", "unit", "what", "reason", "who"}  # oldest first; time = Unix s

disable: no new requests; requests in flight (streams included) run to their end. drain: the
same, reported as "draining" until in-flight reaches 0, then "drained" (`drained: true`): poll
the unit until then before taking it down. enable: the admin lets it serve again; it is routable
once probes and the breaker agree. A unit added at run time is not routable until its probes
pass. Removing a unit lets its in-flight requests finish. All of this survives a restart when
`[admin].state_file` is set; on start each re-applied override is logged as a "restored" event.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from aiohttp import web

from gateway.admin import openapi
from gateway.admin.auth import Authenticator
from gateway.admin.errors import AdminError, bad_request
from gateway.admin.keys import KeyAdmin
from gateway.admin.replicas import Fleet
from gateway.admin.service import AdminService
from gateway.admin.shared import StoreUnavailable
from gateway.admin.state import State
from gateway.admin.store import StoreError
from gateway.admin.view import BreakerView, Settle, WorkersView, unit_view
from gateway.errors import GatewayError
from gateway.rollout.ports import RolloutError
from gateway.rollout.rollouts import Rollouts
from gateway.units import UnitState

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")
DEFAULT_EVENTS = 100
STATUS_EVENTS = 30  # the latest events on the status page
# With workers, an admin change is answered once every worker applied it, waiting at most this
# long (a worker that has not is logged by the pool, and the change reaches it on its own).
SETTLE_WITHIN = 1.0
_WRITES = frozenset(("POST", "DELETE"))
WHO = web.RequestKey("who", str)  # the caller's token name, set by the auth middleware


class AdminApi:
    def __init__(
        self,
        service: AdminService,
        auth: Callable[[], Authenticator],
        breaker_view: BreakerView | None = None,
        workers: WorkersView | None = None,
        settle: Settle | None = None,
        rollouts: Rollouts | None = None,
    ) -> None:
        self.service = service
        self.rollouts = rollouts
        self._settle = settle
        self.keys = KeyAdmin(service)
        self._auth = auth  # known once the admin has started
        self._breaker_view = breaker_view
        self._workers = workers

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        app.add_routes(
            [
                web.get("/units", self.list_units),
                web.post("/units", self.add_unit),
                web.get("/units/{id}", self.get_unit),
                web.delete("/units/{id}", self.remove_unit),
                web.post("/units/{id}/disable", self.disable),
                web.post("/units/{id}/drain", self.drain),
                web.post("/units/{id}/enable", self.enable),
                web.get("/events", self.events),
                web.get("/workers", self.workers),
                web.get("/keys", self.list_keys),
                web.post("/keys", self.create_key),
                web.delete("/keys/{id}", self.revoke_key),
                web.post("/rollouts", self.start_rollout),
                web.get("/rollouts", self.list_rollouts),
                web.get("/rollouts/current", self.current_rollout),
                web.post("/rollouts/current/pause", self.steer_rollout),
                web.post("/rollouts/current/resume", self.steer_rollout),
                web.post("/rollouts/current/abort", self.steer_rollout),
                web.get("/rollouts/current/verdict", self.rollout_verdict),
                openapi.route(),  # the one route without a token
            ]
        )
        return app

    async def list_units(self, request: web.Request) -> web.Response:
        registry = self.service.units
        views = await self._views(list(registry.units.values()))
        return _json(200, {"units": views, "panic": dict(registry.panic)})

    async def snapshot(self) -> dict[str, Any]:
        """What the status page shows: every unit's view, panics, the latest events."""
        registry = self.service.units
        return {
            "time": time.time(),
            "units": await self._views(list(registry.units.values())),
            "panic": dict(registry.panic),
            "events": [e.to_json() for e in self.service.events.recent(STATUS_EVENTS)],
            "rollout": None if self.rollouts is None else self.rollouts.view(),
        }

    async def workers(self, request: web.Request) -> web.Response:
        """The worker processes ([gateway].workers > 1): pid, uptime, restarts, requests
        served, the state version applied and its propagation time. Empty in one process."""
        return _json(200, {"workers": self._workers() if self._workers is not None else []})

    async def get_unit(self, request: web.Request) -> web.Response:
        return _json(200, await self._view(self.service.unit(request.match_info["id"])))

    async def disable(self, request: web.Request) -> web.Response:
        return await self._set_state(request, "disabled", reason_required=True)

    async def drain(self, request: web.Request) -> web.Response:
        return await self._set_state(request, "draining", reason_required=False)

    async def enable(self, request: web.Request) -> web.Response:
        return await self._set_state(request, "enabled", reason_required=False)

    async def add_unit(self, request: web.Request) -> web.Response:
        body = await _body(request, required=True)
        unit = await self.service.add(body, request[WHO])
        return _json(201, await self._view(unit))

    async def remove_unit(self, request: web.Request) -> web.Response:
        unit = await self.service.remove(request.match_info["id"], request[WHO])
        return _json(200, {"id": unit.id, "removed": True, "in_flight": unit.inflight})

    async def events(self, request: web.Request) -> web.Response:
        text = request.query.get("limit", str(DEFAULT_EVENTS))
        if not text.isdigit() or int(text) < 1:
            raise bad_request(f"limit must be a positive integer, got {text!r}", "invalid_query")
        limit, unit = int(text), request.query.get("unit") or None
        shared, answer = self.service.shared, dict[str, str]()
        if shared is None:
            found = self.service.events.recent(limit, unit)
        else:
            try:
                found = await shared.events(limit, unit)
                answer["source"] = "shared"
            except StoreError as exc:  # this replica's own log is better than none
                found = self.service.events.recent(limit, unit)
                answer.update(source="local", warning=f"{exc}: this replica's events only")
        return _json(200, {"events": [e.to_json() for e in found], **answer})

    async def list_keys(self, request: web.Request) -> web.Response:
        return _json(200, await self.keys.list())

    async def create_key(self, request: web.Request) -> web.Response:
        body = await _body(request, required=True)
        return _json(201, await self.keys.create(body, request[WHO]))

    async def revoke_key(self, request: web.Request) -> web.Response:
        return _json(200, await self.keys.revoke(request.match_info["id"], request[WHO]))

    async def start_rollout(self, request: web.Request) -> web.Response:
        rollouts = self._rollouts()
        body = await _body(request, required=True)
        record = await _steered(rollouts.start(body, request[WHO]))
        view = record.view()
        if rollouts.note:
            view["note"] = rollouts.note
        return _json(201, view)

    async def list_rollouts(self, request: web.Request) -> web.Response:
        records = await self._rollouts().listing()
        return _json(200, {"rollouts": [r.view() for r in records]})

    async def current_rollout(self, request: web.Request) -> web.Response:
        record = self._rollouts().current
        if record is None:
            raise AdminError("no rollout has run yet", status=404, code="no_rollout")
        return _json(200, record.view())

    async def steer_rollout(self, request: web.Request) -> web.Response:
        rollouts, who = self._rollouts(), request[WHO]
        verb = request.path.rsplit("/", 1)[1]
        steer = {"pause": rollouts.pause, "resume": rollouts.resume, "abort": rollouts.abort}[verb]
        return _json(200, (await _steered(steer(who))).view())

    async def rollout_verdict(self, request: web.Request) -> web.Response:
        rollouts = self._rollouts()
        try:
            return _json(200, rollouts.verdict())
        except RolloutError as exc:
            raise AdminError(str(exc), status=exc.status, code=exc.code) from None

    def _rollouts(self) -> Rollouts:
        if self.rollouts is None:
            raise AdminError(
                "rollouts need the request path in this process", status=404, code="no_rollouts"
            )
        return self.rollouts

    async def _set_state(
        self, request: web.Request, state: State, *, reason_required: bool
    ) -> web.Response:
        reason = _reason(await _body(request, required=reason_required), reason_required)
        unit_id = request.match_info["id"]
        unit = await self.service.set_state(unit_id, state, reason, request[WHO])
        return _json(200, await self._view(unit))

    async def _view(self, unit: UnitState) -> dict[str, Any]:
        return (await self._views([unit]))[0]

    async def _views(self, units: list[UnitState]) -> list[dict[str, Any]]:
        """With shared state, each unit's fleet view too: `drained` then means every replica."""
        fleet = await self.service.fleet()
        views = []
        for unit in units:
            mark = self.service.marks.get(unit.id)
            if mark is None:  # removed through another replica while the fleet was read
                continue
            across = fleet.unit(unit.id) if isinstance(fleet, Fleet) else fleet
            views.append(unit_view(unit, mark, self._breaker_view, across))
        return views

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Authenticate every admin route but the OpenAPI document, and answer typed errors in
        the OpenAI shape."""
        try:
            if request.match_info.route.name != openapi.ROUTE:
                request[WHO] = self._auth().who(request.headers.get("Authorization"))
            response = await handler(request)
            if self._settle is not None and request.method in _WRITES and response.status < 400:
                await self._settle(SETTLE_WITHIN)  # answered: in effect on every worker
            return response
        except GatewayError as exc:
            return exc.response()
        except StoreUnavailable as exc:
            # Not made anywhere: the operator may retry once the store is back.
            failure = AdminError(
                f"not applied: {exc}", status=503, code="state_store_unavailable",
                type_="server_error",
            )  # fmt: skip
            return failure.response()
        except StoreError as exc:
            failure = AdminError(str(exc), status=500, code="state_not_saved", type_="server_error")
            return failure.response()


async def _body(request: web.Request, *, required: bool) -> object:
    raw = await request.read()
    if not raw.strip():
        if required:
            raise bad_request("a JSON body is required")
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from None


def _reason(body: object, required: bool) -> str:
    if not isinstance(body, dict):
        raise bad_request('the body must be a JSON object like {"reason": "..."}')
    unknown = sorted(set(body) - {"reason"})
    if unknown:
        raise bad_request(f"unknown key [body].{unknown[0]}; known keys: ['reason']")
    reason = body.get("reason", "")
    if not isinstance(reason, str):
        raise bad_request(f"[body].reason must be a string, got {reason!r}")
    if required and not reason.strip():
        raise bad_request("[body].reason is required: say why the unit is taken out of service")
    return reason.strip()


async def _steered(action: Awaitable[T]) -> T:
    try:
        return await action
    except RolloutError as exc:
        raise AdminError(str(exc), status=exc.status, code=exc.code) from None


def _json(status: int, payload: object) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(payload), content_type="application/json")
