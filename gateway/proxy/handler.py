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
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web

from gateway.auth.check import Gatekeeper
from gateway.base.loop import KeepsLoop
from gateway.config import Config
from gateway.errors import GatewayError, Overloaded, UpstreamError
from gateway.limits.limiter import Limiter
from gateway.outcomes import End
from gateway.paths import (
    BATCH,
    CHAT_PATH,
    COMPLETIONS_PATH,
    COUNT_TOKENS_PATH,
    EMBEDDINGS_PATH,
    MESSAGES_PATH,
    POOLING,
    RESPONSES_PATH,
    TOKENIZER_INFO_PATH,
    TOKENS,
)
from gateway.proxy import quota, stored
from gateway.proxy.apis import (
    validate_count_tokens,
    validate_embeddings,
    validate_messages,
    validate_other,
    validate_responses,
    validate_streamable,
)
from gateway.proxy.call import Call
from gateway.proxy.context import ProxyContext
from gateway.proxy.dispatch import Dispatcher
from gateway.proxy.exchange import AioExchange, Exchange
from gateway.proxy.intake import Intake, Validator, request_id
from gateway.proxy.lease import PREEMPTED, Lease
from gateway.proxy.live import LiveStreams
from gateway.proxy.stream import headers_for, relay_stream
from gateway.proxy.upstream import Answer
from gateway.proxy.validation import RequestInfo, model_of, validate_chat, validate_completion
from gateway.relay.usage import of_body
from gateway.routing.admission import Admission
from gateway.signals import Signals

# A route's handler: aiohttp calls it with its request, the lean front with its own.
Route = Callable[[web.BaseRequest | Exchange], Coroutine[Any, Any, web.StreamResponse]]
# A route's intake: reads what the request asks for onto its call (intake.py).
Reader = Callable[[Call, Exchange], Awaitable[None]]
_YES = frozenset({"1", "true", "yes", "on", "t", "y"})  # a query's true, as vLLM reads it


class ProxyHandler(KeepsLoop):
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
        self.signals: Signals[Call] = dispatcher.signals
        self.stored = stored.StoredResponses(config, dispatcher.units, dispatcher.upstream)
        self.intake = Intake(config, self.stored, dispatcher.prompts, dispatcher.turns)
        self.context = ProxyContext(config, dispatcher, live)
        self._loop = None

        # The POST routes' handlers: `_proxy` itself with the path bound (partials, not
        # wrapper coroutines, so an open stream's task holds one coroutine frame less).
        validators: dict[str, Validator] = {
            CHAT_PATH: validate_chat,
            COMPLETIONS_PATH: validate_completion,
            RESPONSES_PATH: validate_responses,
            MESSAGES_PATH: validate_messages,
            EMBEDDINGS_PATH: validate_embeddings,
            COUNT_TOKENS_PATH: validate_count_tokens,
            **dict.fromkeys(BATCH, validate_streamable),
            **dict.fromkeys((*TOKENS, *POOLING), validate_other),
        }
        self.posts: dict[str, Route] = {p: self._route(p, v) for p, v in validators.items()}

    def _route(self, path: str, validate: Validator) -> Route:
        read = functools.partial(self.intake, validate=validate)
        return functools.partial(self._proxy, path=path, read=read)

    async def stored_response(self, request: web.Request) -> web.StreamResponse:
        """`GET /v1/responses/{id}` (streamed with `?stream=true`): from the unit holding it."""
        query = request.rel_url.raw_query_string
        streamed = request.query.get("stream", "").lower() in _YES
        read = functools.partial(
            self._read_stored, response_id=request.match_info["id"], query=query, stream=streamed
        )
        return await self._proxy(request, path=RESPONSES_PATH, read=read, method="GET")

    async def cancel_response(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/responses/{id}/cancel`: to the unit holding it (no body is read)."""
        read = functools.partial(
            self._read_stored, response_id=request.match_info["id"], tail="/cancel"
        )
        return await self._proxy(request, path=RESPONSES_PATH, read=read)

    async def tokenizer_info(self, request: web.Request) -> web.StreamResponse:
        """`GET /tokenizer_info`: a unit of the model the query names (`?model=`, a gateway
        extension: vLLM's has none), else of the default model."""
        read = functools.partial(self._read_get, query=request.query.get("model"))
        return await self._proxy(request, path=TOKENIZER_INFO_PATH, read=read, method="GET")

    async def _read_stored(
        self,
        call: Call,
        request: Exchange,
        *,
        response_id: str,
        tail: str = "",
        query: str = "",
        stream: bool = False,
    ) -> None:
        home = await self.stored.home(response_id, None, call.rid)
        call.home = home
        call.send_path = stored.target(response_id, tail, query)
        self.intake.bodiless(call, request, RequestInfo(home.models[0], stream, None, ""))

    async def _read_get(self, call: Call, request: Exchange, *, query: str | None) -> None:
        model = model_of({"model": query}, self.intake.served)
        self.intake.bodiless(call, request, RequestInfo(model, False, None, ""))

    async def _proxy(
        self,
        request: web.BaseRequest | Exchange,
        *,
        path: str,
        read: Reader,
        method: str = "POST",
    ) -> web.StreamResponse:
        loop = self._loop or self._bind_loop()
        start = loop.time()
        deadline = start + self.config.timeouts.total
        if isinstance(request, web.BaseRequest):
            request = AioExchange(request)
        request.hold()
        lease = Lease(self.admission, asyncio.current_task(loop))
        call = Call(path, request_id(request.headers), request.headers, start, deadline, lease)
        call.method = method
        self.signals.received(call)
        try:
            try:
                with lease:  # whatever ends the request gives its slot back
                    opened = await self._open(call, request, read)
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
        self, call: Call, request: Exchange, read: Reader
    ) -> web.StreamResponse | Answer:
        """Everything up to the answer's first byte. A refusal, an error or a whole answer
        comes back as its response; a streamed answer comes back to be relayed."""
        try:
            call.caller = self.gate.caller(request.headers.get("Authorization"))
            await read(call, request)
            if quota.limited(call):
                await quota.admit(self.limiter, call)
            self.signals.validated(call)
            unit, answer = await self.dispatcher.open(call)
        except GatewayError as exc:
            if isinstance(exc, quota.RateLimited):
                self.signals.rejected(call, exc.refusal.code)
            return self._error(call, exc)
        call.unit, call.status = unit, answer.status
        if call.path == RESPONSES_PATH and answer.status == 200:
            self.stored.learn(answer, unit)  # a follow-up or a read of it must come here
        call.lease.started = True  # its answer begins: no longer preemptible
        ttft = (self._loop or self._bind_loop()).time() - call.start
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
