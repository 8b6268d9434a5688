"""The OpenAI endpoints' request path: one coroutine owns each request and runs its phases.

intake (read, validate: intake.py) -> dispatch (pick, admit, open, retry: dispatch.py) ->
relay and resumption for a stream (stream.py, resume.py) -> end. The request is one Call
(call.py) that every phase reads and writes; its admission slot is one Lease, given back by
this coroutine's `with` whatever path ends the request; the observers hear `ended` exactly
once, from here. Policies (balance, budget, admission) decide; this module only sequences.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from gateway.auth.check import Gatekeeper
from gateway.config import Config
from gateway.errors import GatewayError, Overloaded, UpstreamError
from gateway.limits.limiter import Limiter
from gateway.outcomes import End
from gateway.paths import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    EMBEDDINGS_PATH,
    MESSAGES_PATH,
    RESPONSES_PATH,
)
from gateway.proxy import quota
from gateway.proxy.apis import validate_embeddings, validate_messages, validate_responses
from gateway.proxy.call import Call
from gateway.proxy.context import ProxyContext
from gateway.proxy.dispatch import Dispatcher
from gateway.proxy.exchange import AioExchange, Exchange
from gateway.proxy.intake import Intake, Validator, request_id
from gateway.proxy.lease import PREEMPTED, Lease
from gateway.proxy.live import LiveStreams
from gateway.proxy.signals import Signals
from gateway.proxy.stream import headers_for, relay_stream
from gateway.proxy.upstream import Answer
from gateway.proxy.usage import of_body
from gateway.proxy.validation import validate_chat, validate_completion
from gateway.routing.admission import Admission

# A route's handler: aiohttp calls it with its request, the lean front with its own.
Route = Callable[[web.BaseRequest | Exchange], Coroutine[Any, Any, web.StreamResponse]]


class ProxyHandler:
    def __init__(
        self,
        config: Config,
        dispatcher: Dispatcher,
        live: LiveStreams,
        gate: Gatekeeper,
        limiter: Limiter,
    ) -> None:
        self.config = config
        self.gate = gate  # who each request is from: its API key
        self.limiter = limiter  # its key's limits
        self.live = live  # streams in flight per unit (the gateway's one, shared with probers)
        self.dispatcher = dispatcher
        self.admission: Admission = dispatcher.admission
        self.signals: Signals = dispatcher.signals
        self.intake = Intake(config)
        self.context = ProxyContext(config, dispatcher, live)

        # The routes' handlers: `_proxy` itself with the path bound (partials, not wrapper
        # coroutines, so an open stream's task holds one coroutine frame less).
        self.chat_completions = self._route(CHAT_PATH, validate_chat)
        self.completions = self._route(COMPLETIONS_PATH, validate_completion)
        self.responses = self._route(RESPONSES_PATH, validate_responses)
        self.messages = self._route(MESSAGES_PATH, validate_messages)
        self.embeddings = self._route(EMBEDDINGS_PATH, validate_embeddings)

    def _route(self, path: str, validate: Validator) -> Route:
        return functools.partial(self._proxy, path=path, validate=validate)

    async def _proxy(
        self, request: web.BaseRequest | Exchange, *, path: str, validate: Validator
    ) -> web.StreamResponse:
        start = asyncio.get_running_loop().time()
        deadline = start + self.config.timeouts.total
        if isinstance(request, web.BaseRequest):
            request = AioExchange(request)
        request.hold()
        lease = Lease(self.admission)
        call = Call(path, request_id(request.headers), request.headers, start, deadline, lease)
        self.signals.received(call)
        try:
            try:
                with lease:  # whatever ends the request gives its slot back
                    opened = await self._open(call, request, validate)
                    if isinstance(opened, Answer):  # relayed from here: `_open`'s frame is
                        # not held by the open stream's task
                        await relay_stream(self.context, request, call, opened)
                        return request.streamed()  # call.status is its answer's
                    response = opened
            except asyncio.CancelledError:
                if not lease.preempted or lease.task is None or lease.task.uncancel() > 0:
                    raise  # the client left (or the server is stopping): not a preemption
                response = self._preempted(call)
            call.status = response.status
            return response
        except BaseException as exc:
            call.error = exc
            raise
        finally:
            quota.settle(self.limiter, call)
            if call.usage is not None:  # the tenant's fair share counts what it really used
                self.admission.charge(lease.ask, call.usage.prompt + call.usage.completion)
            self.signals.ended(call)

    async def _open(
        self, call: Call, request: Exchange, validate: Validator
    ) -> web.StreamResponse | Answer:
        """Everything up to the answer's first byte. A refusal, an error or a whole answer
        comes back as its response; a streamed answer comes back to be relayed."""
        try:
            call.caller = self.gate.caller(request.headers.get("Authorization"))
            await self.intake(call, request, validate)
            await quota.admit(self.limiter, call)
            self.signals.validated(call)
            unit, answer = await self.dispatcher.open(call)
        except GatewayError as exc:
            if isinstance(exc, quota.RateLimited):
                self.signals.rejected(call, exc.refusal.code)
            return self._error(call, exc)
        call.unit, call.status = unit, answer.status
        call.lease.started = True  # its answer begins: no longer preemptible
        ttft = asyncio.get_running_loop().time() - call.start
        self.signals.first_byte(call, unit, ttft)
        if answer.streaming:
            call.ttft = ttft
            return answer
        call.end = End.COMPLETE
        body = answer.first if answer.names is None else answer.names.whole(answer.first)
        call.usage = of_body(body) if answer.status == 200 else None
        self.signals.answer_ended(call, unit, End.COMPLETE, None)
        return web.Response(
            status=answer.status,
            body=body,
            headers=headers_for(unit, call),
            content_type=answer.content_type.split(";")[0],
        )

    def _preempted(self, call: Call) -> web.Response:
        """A request cancelled before its first byte for a more important one: 503, which is
        no unit's fault (the breaker never hears of it) and worth retrying."""
        self.signals.rejected(call, "preempted")
        retry_after = self.admission.retry_after
        exc = Overloaded(PREEMPTED, status=503, code="preempted", retry_after=retry_after)
        return self._error(call, exc)

    @staticmethod
    def _error(call: Call, exc: GatewayError) -> web.Response:
        response = exc.response(call.rid)
        if isinstance(exc, UpstreamError):
            response.headers["x-unitgate-unit"] = exc.unit_id
        return response
