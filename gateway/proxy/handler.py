"""The OpenAI endpoints' request path, as named phases.

read body -> validate -> dispatch (admit to a unit, open upstream, retry) -> relay -> account.
Policies (balance, budget, admission) decide; this module only sequences them.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gateway.config import Config
from gateway.errors import GatewayError, InvalidRequest, UpstreamError
from gateway.observability.metrics import Metrics
from gateway.observability.tracing import Span, Tracing, end_span
from gateway.proxy.dispatch import Call, Dispatcher
from gateway.proxy.relay import relay_stream
from gateway.proxy.upstream import Answer, UpstreamClient
from gateway.proxy.validation import RequestInfo, parse_body, validate_chat, validate_completion
from gateway.routing.admission import Admission
from gateway.routing.affinity import affinity_key
from gateway.units import UnitState

log = logging.getLogger("unitgate.proxy")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
Validator = Callable[[dict[str, Any], frozenset[str], int], RequestInfo]


class ProxyHandler:
    def __init__(self, config: Config, dispatcher: Dispatcher) -> None:
        self.config = config
        self.dispatcher = dispatcher
        self.admission: Admission = dispatcher.admission
        self.upstream: UpstreamClient = dispatcher.upstream
        self.metrics: Metrics = dispatcher.metrics
        self.tracing: Tracing = dispatcher.tracing
        self.models = frozenset(config.gateway.models)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._proxy(request, "/v1/chat/completions", validate_chat)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._proxy(request, "/v1/completions", validate_completion)

    async def _proxy(
        self, request: web.Request, path: str, validate: Validator
    ) -> web.StreamResponse:
        if not self.tracing.enabled:
            return await self._handle(request, path, validate, None)
        span = self.tracing.request_span(f"POST {path}", request.headers)
        assert span is not None
        try:
            response = await self._handle(request, path, validate, span)
        except BaseException as exc:
            end_span(
                span,
                "cancelled" if isinstance(exc, asyncio.CancelledError) else "error",
                error=True,
            )
            raise
        span.set_attribute("http.response.status_code", response.status)
        end_span(span, "ok" if response.status < 400 else "refused", error=response.status >= 500)
        return response

    async def _handle(
        self, request: web.Request, path: str, validate: Validator, span: Span | None
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        start = loop.time()
        rid = request.headers.get("x-request-id", "")
        if not _REQUEST_ID.fullmatch(rid):
            rid = secrets.token_hex(12)
        try:
            body = await self._read_body(request)
            info = validate(parse_body(body), self.models, self.config.routing.prefix_chars)
        except GatewayError as exc:
            return self._error(exc, rid)
        if span is not None:
            span.set_attributes(
                {
                    "unitgate.request_id": rid,
                    "unitgate.model": info.model,
                    "unitgate.stream": info.stream,
                }
            )
        deadline = start + self.config.timeouts.total
        session = request.headers.get("x-session-id") or info.user
        key = affinity_key(self.config.routing.affinity, session, info.prefix)
        try:
            call = Call(path, body, info, key, rid, deadline, span)
            unit, answer = await self.dispatcher.open(call)
        except GatewayError as exc:
            return self._error(exc, rid)
        except asyncio.CancelledError:
            self.metrics.cancellations.labels("none").inc()
            raise
        try:
            return await self._respond(request, unit, answer, rid, start, deadline)
        finally:
            self.admission.release(unit)

    async def _respond(
        self,
        request: web.Request,
        unit: UnitState,
        answer: Answer,
        rid: str,
        start: float,
        deadline: float,
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        headers = {"x-unitgate-unit": unit.id, "x-request-id": rid}
        self.metrics.ttft.labels(unit.id).observe(loop.time() - start)
        if not answer.streaming:
            self.dispatcher.on_outcome(unit, True, start)
            self._account(unit.id, answer.status, start)
            return web.Response(
                status=answer.status,
                body=answer.first,
                headers=headers,
                content_type=answer.content_type.split(";")[0],
            )
        itl = self.metrics.itl.labels(unit.id)
        try:
            outcome = await relay_stream(
                request, answer, headers, deadline, self.config.timeouts.idle, itl
            )
        except asyncio.CancelledError:
            self.metrics.cancellations.labels(unit.id).inc()
            raise
        finally:
            self.upstream.finish(answer)  # closes the connection unless the answer ended cleanly
        if outcome.kind == "client_gone":
            self.metrics.cancellations.labels(unit.id).inc()
        elif outcome.kind == "complete":
            self.dispatcher.on_outcome(unit, True, start)
        else:
            # A total timeout is the request's own budget running out, not the unit's fault.
            if outcome.kind != "total_timeout":
                self.dispatcher.on_outcome(unit, False, start)
            self.metrics.upstream_failures.labels(unit.id, outcome.kind).inc()
            log.warning("stream from unit %s broke after the first byte: %s", unit.id, outcome.kind)
        self._account(unit.id, answer.status, start)
        return outcome.response

    def _account(self, unit_id: str, status: int, start: float) -> None:
        self.metrics.requests.labels(unit_id, str(status)).inc()
        self.metrics.e2e.labels(unit_id).observe(asyncio.get_running_loop().time() - start)

    async def _read_body(self, request: web.Request) -> bytes:
        """The whole body; the app's `client_max_size` enforces the limit while reading."""
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            limit = self.config.gateway.max_body_bytes
            raise InvalidRequest(
                f"request body exceeds {limit} bytes", status=413, code="body_too_large"
            ) from None

    def _error(self, exc: GatewayError, rid: str) -> web.Response:
        self.metrics.requests.labels("none", str(exc.status)).inc()
        response = exc.response()
        response.headers["x-request-id"] = rid
        if isinstance(exc, UpstreamError):
            response.headers["x-unitgate-unit"] = exc.unit_id
        return response
