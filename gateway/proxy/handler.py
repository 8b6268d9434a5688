"""The OpenAI endpoints' request path, as named phases.

read body -> validate -> dispatch (admit to a unit, open upstream, retry) -> relay -> account.
Policies (balance, budget, admission) decide; this module only sequences them.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gateway.config import Config
from gateway.errors import GatewayError, InvalidRequest, UpstreamError
from gateway.observability.tracing import Span, Tracing, end_span
from gateway.outcomes import End
from gateway.proxy.context import ProxyContext
from gateway.proxy.dispatch import Call, Dispatcher
from gateway.proxy.lease import Lease
from gateway.proxy.live import LiveStreams
from gateway.proxy.resume import resumable, with_token_ids
from gateway.proxy.signals import Signals
from gateway.proxy.stream import StreamSession, headers_for
from gateway.proxy.tracker import StreamTracker
from gateway.proxy.upstream import UpstreamClient
from gateway.proxy.validation import RequestInfo, parse_body, validate_chat, validate_completion
from gateway.routing.admission import Admission
from gateway.routing.affinity import affinity_key

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
Validator = Callable[[dict[str, Any], frozenset[str], int], RequestInfo]


CHAT_PATH = "/v1/chat/completions"


class ProxyHandler:
    def __init__(
        self,
        config: Config,
        dispatcher: Dispatcher,
        live: LiveStreams,
    ) -> None:
        self.config = config
        self.live = live  # streams in flight per unit (the gateway's one, shared with probers)
        self.dispatcher = dispatcher
        self.admission: Admission = dispatcher.admission
        self.upstream: UpstreamClient = dispatcher.upstream
        self.signals: Signals = dispatcher.signals
        self.tracing: Tracing = dispatcher.tracing
        self.models = frozenset(config.gateway.models)
        self.context = ProxyContext(config, dispatcher, self.live)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._proxy(request, CHAT_PATH, validate_chat)

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
            data = parse_body(body)
            info = validate(data, self.models, self.config.routing.prefix_chars)
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
        chat = path == CHAT_PATH
        tracker = None
        if self.config.resume.enabled and resumable(data, chat):
            tracker = StreamTracker(chat, data.get("return_token_ids") is True, _usage(data))
            body = with_token_ids(data)
        with Lease(self.admission) as lease:  # whatever ends the request gives its slot back
            call = Call(path, body, info, key, rid, deadline, lease, span)
            try:
                unit, answer = await self.dispatcher.open(call)
            except GatewayError as exc:
                return self._error(exc, rid)
            except asyncio.CancelledError:
                self.signals.cancelled("none")
                raise
            now = loop.time()
            self.live.began(unit.id, now)
            self.signals.first_byte(unit, now - start)
            if answer.streaming:
                stream = StreamSession(self.context, request, call, data, tracker, start)
                return await stream.run(unit, answer)
            self.signals.answer_ended(unit, End.COMPLETE, None, start)
            self.context.finished(unit.id, answer.status, start)
            return web.Response(
                status=answer.status,
                body=answer.first,
                headers=headers_for(unit, rid),
                content_type=answer.content_type.split(";")[0],
            )

    async def _read_body(self, request: web.Request) -> bytes:
        """The whole body; the app's `client_max_size` enforces the limit while reading.

        A client trickling its body (a byte a second) would otherwise hold the connection and
        its buffer forever: reading is bounded by the request's `total` timeout (408).
        """
        try:
            async with asyncio.timeout(self.config.timeouts.total):
                return await request.read()
        except TimeoutError:
            raise InvalidRequest(
                f"request body not received within {self.config.timeouts.total:g} s",
                status=408,
                code="body_timeout",
            ) from None
        except web.RequestPayloadError as exc:  # undecodable gzip/deflate/br, broken chunks
            detail = getattr(exc.__cause__, "message", None) or str(exc)
            raise InvalidRequest(f"request body could not be read: {detail}") from None
        except web.HTTPRequestEntityTooLarge:
            limit = self.config.gateway.max_body_bytes
            raise InvalidRequest(
                f"request body exceeds {limit} bytes", status=413, code="body_too_large"
            ) from None

    def _error(self, exc: GatewayError, rid: str) -> web.Response:
        self.signals.refused(exc.status)
        response = exc.response()
        response.headers["x-request-id"] = rid
        if isinstance(exc, UpstreamError):
            response.headers["x-unitgate-unit"] = exc.unit_id
        return response


def _usage(data: dict[str, Any]) -> bool:
    options = data.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True
