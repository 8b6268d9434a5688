"""Request handlers: OpenAI JSON in, engine calls, OpenAI JSON or SSE out.

The first engine event is awaited before any byte is sent, so a refusal or an engine failure
can still be an honest HTTP status (400/503) instead of a broken 200 stream.

A streamed request marked `x-unitgate-tied: 1` is one of two copies a gateway sent to two
units at once: its answer's head goes out when the engine starts it (its prompt first fed),
before its first token, and the gateway cancels the other copy on the first head it gets,
most often before that copy left its unit's queue. A refusal still comes as an HTTP status
(it is known before the start); a failure after the start comes as an SSE error event.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator

from aiohttp import web

from engine.api import STARTED, Engine, GenerationRequest, TokenEvent
from engine.runtime import node_metrics
from engine.runtime.health import read_report
from engine.server.errors import ApiError, engine_failed, json_response, refused
from engine.server.parse import Kind, parse_request
from engine.server.tokens import TokenBytes
from engine.server.wire import DONE, Bodies, sse

# An x-request-id is reused as the engine id and in response ids; anything odd gets a fresh one.
_SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_GOOD_ENDINGS = ("stop", "length")
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
TIED = "x-unitgate-tied"  # "1": send the answer's head when the request starts


class EngineCall:
    """One engine request; closing it before its last final event aborts it, so a cancelled
    handler (client gone) frees the sequences at the engine's next step. A request of n
    choices is finished after n final events."""

    def __init__(self, engine: Engine, request: GenerationRequest, prompt_param: str) -> None:
        self.engine, self.request, self.prompt_param = engine, request, prompt_param
        self.events: AsyncIterator[TokenEvent] | None = None
        self.finished = False
        self._open = request.n  # choices without their final event yet

    async def next(self) -> TokenEvent:
        """The next event; an engine refusal or failure comes out as an ApiError."""
        try:
            if self.events is None:
                self.events = self.engine.generate(self.request)
            event = await anext(self.events)
        except StopAsyncIteration:
            self.finished = True
            raise engine_failed("the engine ended the request without a final event") from None
        except ValueError as exc:
            self.finished = True
            raise refused(exc, self.prompt_param) from None
        if event.finished:
            self._open -= 1
            self.finished = self._open == 0
        if event.error is not None or (event.finished and event.finish_reason not in _GOOD_ENDINGS):
            raise engine_failed(event.error or f"generation ended early ({event.finish_reason})")
        return event

    async def close(self) -> None:
        if not self.finished:
            self.finished = True
            self.engine.abort(self.request.request_id)
        aclose = getattr(self.events, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


class Handlers:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.token_bytes = TokenBytes(engine.tokenizer)
        self.started = int(time.time())
        self.live: set[str] = set()  # engine ids in flight: a reused x-request-id must not clash

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def models(self, request: web.Request) -> web.Response:
        model = {"id": self.engine.model_name, "object": "model", "created": self.started}
        model |= {"owned_by": "unitgate", "max_model_len": self.engine.max_seq_len}
        return json_response({"object": "list", "data": [model]})

    async def health(self, request: web.Request) -> web.Response:
        """200 only when the engine says ok, so a load balancer drains a degraded unit."""
        fields = read_report(self.engine.health)
        return json_response(fields, 200 if fields.get("status") == "ok" else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        """The health report as Prometheus text, under vLLM's names (node_metrics)."""
        text = node_metrics.render(read_report(self.engine.health))
        return web.Response(body=text.encode(), content_type="text/plain", charset="utf-8")

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        try:
            parsed = parse_request(kind, await request.read(), self.engine)
        except ApiError as exc:
            return exc.response()
        rid = self._request_id(request)
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        bodies = Bodies(
            parsed, prefix + rid, int(time.time()), self.engine.model_name, self.token_bytes
        )
        tied = parsed.stream and request.headers.get(TIED, "").strip() == "1"
        generation = GenerationRequest(
            rid,
            parsed.prompt_ids,
            parsed.params,
            n=parsed.n,
            grammar=parsed.grammar,
            announce_start=tied,
        )
        call = EngineCall(self.engine, generation, parsed.prompt_param)
        self.live.add(rid)
        try:
            first = await call.next()
            if first is STARTED:
                return await self._started(request, bodies, call)
            if parsed.stream:
                return await self._stream(request, bodies, call, first)
            return await self._collect(bodies, call, first)
        except ApiError as exc:
            return exc.response()
        finally:
            await call.close()
            self.live.discard(rid)

    def _request_id(self, request: web.Request) -> str:
        rid = request.headers.get("x-request-id", "")
        if not _SAFE_ID.fullmatch(rid):
            rid = uuid.uuid4().hex
        while rid in self.live:
            rid = f"{rid}-{uuid.uuid4().hex[:8]}"
        return rid

    async def _started(
        self, request: web.Request, bodies: Bodies, call: EngineCall
    ) -> web.StreamResponse:
        """A tied request started: its head now, its first token when it comes."""
        response = await self._head(request, call)
        try:
            first = await call.next()
        except ApiError as exc:
            with contextlib.suppress(ConnectionResetError):  # the client may have left
                await response.write(sse(exc.payload()))
            return response
        return await self._stream(request, bodies, call, first, response)

    async def _head(self, request: web.Request, call: EngineCall) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={**SSE_HEADERS, "x-request-id": call.request.request_id}
        )
        await response.prepare(request)  # aiohttp sends a stream's head at once
        return response

    async def _stream(
        self,
        request: web.Request,
        bodies: Bodies,
        call: EngineCall,
        event: TokenEvent,
        response: web.StreamResponse | None = None,
    ) -> web.StreamResponse:
        """One SSE event per chunk; a mid-stream failure ends with an error event, no [DONE],
        so a client (and the gateway) can tell a truncated answer from a finished one."""
        if response is None:
            response = await self._head(request, call)
        payloads = bodies.opening()
        try:
            while True:
                payloads += bodies.chunks(event)
                await response.write(b"".join(sse(p) for p in payloads))
                if call.finished:
                    break
                event = await call.next()
                payloads = []
        except ApiError as exc:
            await response.write(sse(exc.payload()))
            return response
        except ConnectionResetError:
            return response  # the client left between writes; the caller's finally aborts
        tail = [bodies.usage_chunk()] if bodies.req.include_usage else []
        await response.write(b"".join(sse(p) for p in tail) + DONE)
        return response

    async def _collect(self, bodies: Bodies, call: EngineCall, event: TokenEvent) -> web.Response:
        while True:
            bodies.record(event)
            if call.finished:
                break
            event = await call.next()
        response = json_response(bodies.full())
        response.headers["x-request-id"] = call.request.request_id
        return response
