"""The OpenAI endpoints' request path, as named phases.

read body -> validate -> (retry loop: admit to a unit -> open upstream) -> relay -> account.
Policies (balance, budget, admission) decide; this module only sequences them.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections.abc import Callable
from random import Random
from typing import Any

from aiohttp import web
from tenacity import AsyncRetrying, RetryCallState, stop_after_attempt, wait_none

from gateway.config import Config
from gateway.errors import GatewayError, InvalidRequest, Overloaded, UpstreamError
from gateway.observability.metrics import Metrics
from gateway.proxy.relay import relay_stream
from gateway.proxy.upstream import Answer, UpstreamClient
from gateway.proxy.validation import RequestInfo, parse_body, validate_chat, validate_completion
from gateway.routing.admission import Admission
from gateway.routing.affinity import affinity_key
from gateway.routing.balance import choose
from gateway.routing.budget import RetryBudget
from gateway.units import UnitRegistry, UnitState

log = logging.getLogger("unitgate.proxy")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
Validator = Callable[[dict[str, Any], frozenset[str], int], RequestInfo]


class _Attempt:
    """Per-request retry state: units tried so far and the last failure."""

    __slots__ = ("last_error", "tried")

    def __init__(self) -> None:
        self.tried: list[UnitState] = []
        self.last_error: UpstreamError | None = None


class ProxyHandler:
    def __init__(
        self,
        config: Config,
        units: UnitRegistry,
        admission: Admission,
        upstream: UpstreamClient,
        metrics: Metrics,
        rng: Random | None = None,
    ) -> None:
        self.config = config
        self.units = units
        self.admission = admission
        self.upstream = upstream
        self.metrics = metrics
        self.rng = rng or Random()
        self.models = frozenset(config.gateway.models)
        self.budget = RetryBudget(
            config.retry.budget_ratio,
            config.retry.budget_min_per_second,
            config.retry.budget_window,
        )

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._proxy(request, "/v1/chat/completions", validate_chat)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._proxy(request, "/v1/completions", validate_completion)

    async def _proxy(
        self, request: web.Request, path: str, validate: Validator
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
        deadline = start + self.config.timeouts.total
        state = _Attempt()
        try:
            session = request.headers.get("x-session-id") or info.user
            key = affinity_key(self.config.routing.affinity, session, info.prefix)
            unit, answer = await self._open_with_retries(
                path, body, info, key, rid, deadline, state
            )
        except GatewayError as exc:
            return self._error(exc, rid)
        except asyncio.CancelledError:
            self.metrics.cancellations.labels("none").inc()
            raise
        try:
            return await self._respond(request, unit, answer, rid, start, deadline)
        finally:
            self.admission.release(unit)

    async def _open_with_retries(
        self,
        path: str,
        body: bytes,
        info: RequestInfo,
        key: int | None,
        rid: str,
        deadline: float,
        state: _Attempt,
    ) -> tuple[UnitState, Answer]:
        loop = asyncio.get_running_loop()
        self.budget.deposit(loop.time())
        # A non-streamed answer's first byte comes when it is complete: only `total` bounds it.
        first_byte = self.config.timeouts.first_byte if info.stream else self.config.timeouts.total

        def pick() -> UnitState | None:
            routable = self.units.routable(info.model)
            if not routable or all(u in state.tried for u in routable):
                if state.last_error is not None:
                    raise state.last_error
                raise Overloaded(
                    f"no routable unit serves model '{info.model}'",
                    status=503,
                    code="no_routable_unit",
                    retry_after=self.admission.retry_after,
                )
            return choose(
                routable, state.tried, key, self.config.routing.bounded_load_factor, self.rng
            )

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.config.retry.max_attempts),
            retry=lambda rs: self._may_retry(rs, state, info.model),
            wait=wait_none(),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                unit = await self._admit(pick)
                try:
                    first_byte_at = min(loop.time() + first_byte, deadline)  # per attempt
                    return unit, await self.upstream.open(
                        unit.id, unit.leader, path, body, rid, first_byte_at
                    )
                except BaseException as exc:
                    self.admission.release(unit)
                    if isinstance(exc, UpstreamError):
                        state.tried.append(unit)
                        state.last_error = exc
                        self.metrics.upstream_failures.labels(unit.id, exc.kind).inc()
                        log.warning("attempt failed: %s", exc.message)
                    raise
        raise AssertionError("unreachable: tenacity re-raises the last failure")

    async def _admit(self, pick: Callable[[], UnitState | None]) -> UnitState:
        try:
            return await self.admission.acquire(pick)
        except Overloaded as exc:
            self.metrics.rejections.labels(exc.code or "overloaded").inc()
            raise

    def _may_retry(self, rs: RetryCallState, state: _Attempt, model: str) -> bool:
        exc = rs.outcome.exception() if rs.outcome else None
        if not isinstance(exc, UpstreamError) or not exc.retryable:
            return False
        if rs.attempt_number >= self.config.retry.max_attempts:
            return False
        if all(u in state.tried for u in self.units.routable(model)):
            return False  # nowhere else to go: do not spend budget
        if not self.budget.withdraw(asyncio.get_running_loop().time()):
            self.metrics.budget_exhausted.inc()
            return False
        self.metrics.retries.labels(exc.kind).inc()
        return True

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
        elif outcome.kind != "complete":
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
