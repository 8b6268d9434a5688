"""OpenAI-compatible API of a simulated unit's leader node (test tool).

Faults are applied here, in one place, from the plain data the control API stored: the
fault is picked at admission and then decides how far the normal path runs. What the answer
is (text, or a tool call when the request offers tools) is fixed before admission too, from
the unit's settings, so a fault cuts a tool call exactly as it cuts text.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass

import orjson
from aiohttp import web

from loadtest.simunits.jsonhttp import json_response
from loadtest.simunits.openai_format import (
    DONE_EVENT,
    Bodies,
    GenRequest,
    Kind,
    completion_length,
    error_body,
    parse_request,
    sse_event,
)
from loadtest.simunits.params import ParamError
from loadtest.simunits.state import Fault, FaultMode, Settings
from loadtest.simunits.toolcalls import ToolCall, tool_call, tool_call_length
from loadtest.simunits.unit import SimUnit, wait_forever


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """What all leaders of one simulator share."""

    model: str
    max_tokens_cap: int
    created: int
    ids: itertools.count[int]


@dataclass(frozen=True, slots=True)
class _Job:
    """One admitted generation request on its way through the simulated engine."""

    req: GenRequest
    bodies: Bodies
    settings: Settings
    fault: Fault
    count: int
    finish_reason: str
    call: ToolCall | None
    """The tool call the answer is, instead of text."""
    stall_ms: float = 0.0
    """Added to its first token's latency: a straggler (Settings.stall_rate)."""

    @property
    def cut_after(self) -> int | None:
        """Tokens to send before a stall or drop strikes; it strikes even on short outputs."""
        if self.fault.mode in (FaultMode.STALL, FaultMode.DROP):
            return min(self.fault.after_tokens, self.count)
        return None

    def chunk(self, index: int) -> dict[str, object]:
        """The streamed chunk of token `index`; a continuation's text picks up at `start`."""
        if self.call is not None:
            return self.bodies.tool_call_chunk(self.call, index)
        return self.bodies.token_chunk(self.req.start + index)


class LeaderApi:
    def __init__(self, unit: SimUnit, config: ServeConfig) -> None:
        self._unit = unit
        self._config = config
        self._stalls = random.Random()  # which requests straggle (Settings.stall_rate)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/v1/models", self.models),
            web.post("/v1/chat/completions", self.chat),
            web.post("/v1/completions", self.completions),
        ]

    async def models(self, request: web.Request) -> web.Response:
        model = {
            "id": self._config.model,
            "object": "model",
            "created": self._config.created,
            "owned_by": "unitgate-sim",
        }
        return json_response({"object": "list", "data": [model]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    def _new_id(self, request: web.Request, kind: Kind) -> str:
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        given = request.headers.get("x-request-id")
        return prefix + (given if given else f"sim-{next(self._config.ids)}")

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        try:
            req = parse_request(kind, orjson.loads(await request.read()), self._config.model)
        except orjson.JSONDecodeError:
            return json_response(error_body("request body is not valid JSON"), 400)
        except ParamError as exc:
            return json_response(error_body(str(exc)), 400)
        state = self._unit.state
        job = self._job(req, self._new_id(request, kind), state.settings, state.admit())
        try:
            response, failed = await self._serve(request, job)
        except asyncio.CancelledError:
            state.finish_cancelled(time.time())
            raise
        except ConnectionError:
            # The client left between two writes, before aiohttp cancelled us; the
            # placeholder fails quietly on the dead transport.
            state.finish_cancelled(time.time())
            return web.Response()
        if failed:
            state.finish_failed()
        else:
            state.finish_completed()
        return response

    def _job(self, req: GenRequest, response_id: str, settings: Settings, fault: Fault) -> _Job:
        bodies = Bodies(req, response_id, self._config.created, settings.variant)
        call = tool_call(req.tool, settings.tools, response_id)
        cap = self._config.max_tokens_cap
        if call is None:
            count, finish = completion_length(req, settings.tokens, cap)
        else:
            count, finish = tool_call_length(req.max_tokens, call, cap)
        straggles = settings.stall_rate > 0 and self._stalls.random() < settings.stall_rate
        stall = settings.stall_ms if straggles else 0.0
        return _Job(req, bodies, settings, fault, count, finish, call, stall)

    async def _serve(self, request: web.Request, job: _Job) -> tuple[web.StreamResponse, bool]:
        """Run the request to its end; the flag says whether an injected fault ended it."""
        mode = job.fault.mode
        if mode is FaultMode.ERROR:
            kind = "server_error" if job.fault.status >= 500 else "invalid_request_error"
            body = error_body(f"simulated fault: HTTP {job.fault.status}", kind)
            return json_response(body, job.fault.status), True
        if mode is FaultMode.REFUSE:
            # Reached only by a request that slipped in while the socket was closing.
            return _abort(request, web.Response()), True
        if mode is FaultMode.HANG:
            await wait_forever()
        if job.req.stream:
            return await self._stream(request, job)
        return await self._whole(request, job)

    async def _whole(self, request: web.Request, job: _Job) -> tuple[web.StreamResponse, bool]:
        cut = job.cut_after
        for index in range(job.count if cut is None else cut):
            await self._unit.emit(index, job.settings, job.stall_ms)
        if job.fault.mode is FaultMode.STALL:
            await self._unit.stall_forever()
        if job.fault.mode is FaultMode.DROP:
            return _abort(request, web.Response()), True
        return json_response(job.bodies.full(job.count, job.finish_reason, job.call)), False

    async def _stream(self, request: web.Request, job: _Job) -> tuple[web.StreamResponse, bool]:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        bodies = job.bodies
        cut = job.cut_after
        for index in range(job.count if cut is None else cut):
            await self._unit.emit(index, job.settings, job.stall_ms)
            if index == 0 and job.req.kind == "chat":
                await response.write(sse_event(bodies.role_chunk()))
            await response.write(sse_event(job.chunk(index)))
        if job.fault.mode is FaultMode.STALL:
            await self._unit.stall_forever()
        if job.fault.mode is FaultMode.DROP:
            return _abort(request, response), True
        await response.write(sse_event(bodies.finish_chunk(job.finish_reason)))
        if job.req.include_usage:
            await response.write(sse_event(bodies.usage_chunk(job.count)))
        await response.write(DONE_EVENT)
        await response.write_eof()
        return response, False


def _abort(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """Reset the TCP connection so the client sees a broken transfer, not a clean end."""
    transport = request.transport
    if transport is not None:
        transport.abort()
    return response
