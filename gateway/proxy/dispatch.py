"""Dispatch: pick a unit, admit, open the upstream call; retry elsewhere before the first byte.

The happy path is one plain attempt. Only after a retryable failure does a tenacity loop take
over, with each retry paid from the retry budget and sent to a unit not yet tried: tenacity's
per-call set-up costs tens of microseconds, which the common case should not pay. A
hedge-eligible request's first attempt is raced instead (races.py), on the dispatcher's own
admission and attempts (`Attempts`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from random import Random
from typing import TYPE_CHECKING

from tenacity import AsyncRetrying, RetryCallState, stop_after_attempt, wait_none

from gateway.base.loop import KeepsLoop
from gateway.config import Config
from gateway.errors import InvalidRequest, Overloaded, UpstreamError
from gateway.paths import RESUMABLE
from gateway.proxy.call import Call
from gateway.proxy.hedging import TIED_LINE, Hedger
from gateway.proxy.lease import Lease
from gateway.proxy.names import Renamer, for_unit
from gateway.proxy.priority import with_priority
from gateway.proxy.races import Races
from gateway.proxy.upstream import Answer, UpstreamClient
from gateway.revisions import Canary, draw
from gateway.routing.admission import Admission
from gateway.routing.balance import place
from gateway.routing.budget import CauseBudget, RetryBudget
from gateway.routing.forecast import Estimate, Forecast, Placed
from gateway.signals import Signals
from gateway.units import UnitRegistry, UnitState

if TYPE_CHECKING:
    from gateway.kvevents.prompts import Prompts
    from gateway.kvevents.turns import Turns

# How many of a prompt's leading tokens each of the units holds (gateway/kvevents).
CacheDepths = Callable[[Sequence[int], Iterable[str]], Mapping[str, int]]

# A prompt's tokens, where the gateway does not count them: about four bytes of JSON a token.
BYTES_PER_TOKEN = 4
# The share of requests placed as if there were no forecast: a unit predicted slow gets some
# traffic still, so its model sees it recover.
EXPLORE = 0.05


class Dispatcher(KeepsLoop):
    def __init__(
        self,
        config: Config,
        units: UnitRegistry,
        admission: Admission,
        upstream: UpstreamClient,
        signals: Signals[Call],
        rng: Random | None = None,
        prompts: Prompts | None = None,
        depths: CacheDepths | None = None,
        forecast: Forecast | None = None,
        turns: Turns | None = None,
    ) -> None:
        """`prompts` computes a request's prompt ids at intake, `depths` says which units'
        caches hold their blocks (both None: routing by load and affinity alone); `forecast`
        predicts each unit's latency (None: `[routing] latency_model = "off"`); `turns`
        keeps conversations' turns' prompt ids, for a model without a tokenizer."""
        self.config = config
        self.prompts = prompts
        self.turns = turns
        self.depths = depths
        self.forecast = forecast
        self.by_latency = forecast is not None and config.routing.latency_model == "route"
        # Each class's TTFT target, and whether a request predicted to miss it everywhere
        # is refused.
        self.slos = {
            c.name: (c.ttft_slo, c.shed_on_slo)
            for c in (config.priority.classes if config.priority is not None else ())
            if c.ttft_slo is not None
        }
        self.units = units
        self.admission = admission
        self.upstream = upstream
        self.signals = signals
        self.rng = rng or Random()
        self._loop = None
        r = config.retry
        self.budget = RetryBudget(r.budget_ratio, r.budget_min_per_second, r.budget_window)
        self.resumptions = CauseBudget(self.budget)
        hedged = config.hedge.enabled or (
            config.priority is not None and any(c.hedge for c in config.priority.classes)
        )
        self.hedger = Hedger(config, units, admission) if hedged else None
        self.races = None
        if self.hedger is not None:
            self.races = Races(
                config,
                self.hedger,
                self,
                admission,
                signals,
                upstream.finish,
                forecast is not None,
            )

    async def open(self, call: Call) -> tuple[UnitState, Answer]:
        """A unit (its slot held in `call.lease`) and its answer's start."""
        path = call.send_path
        if call.home is None and path not in RESUMABLE:
            model = call.info.model
            if not any(path in u.serves for u in self.units.units.values() if model in u.models):
                raise InvalidRequest(
                    f"no unit of model '{model}' serves {path} (the builtin engine serves chat "
                    "and completions only)",
                    status=404,
                    code="not_found",
                )
        self.budget.deposit((self._loop or self._bind_loop()).time())
        return await self._open(call)

    async def resume(self, call: Call, cause: tuple[str, str] | None) -> tuple[UnitState, Answer]:
        """Open the continuation of a stream that broke after its first byte (what the call
        sends now: `Call.continue_with`), on a unit not in `call.tried`. A break the unit
        caused (`cause` = its id and the failure kind) is paid from the retry budget once per
        cause (budget.CauseBudget): a failing fleet must not double its load by resuming, but
        one dead leader must not drain the budget either. A break the gateway made itself
        (`cause` None: the unit was ejected) is free."""
        canary, broken = self.units.canary, call.unit
        if canary is not None and broken is not None and broken.revision == canary.new:
            if canary.resume_across:
                call.draw = 1.0  # on the old revision: the new one is on trial
            else:  # another tokenizer's ids would mean other tokens
                call.keep_revision = canary.new
        now = asyncio.get_running_loop().time()
        if cause is not None and not self.resumptions.withdraw(cause, now):
            self.signals.budget_exhausted()
            raise Overloaded(
                "the retry budget is exhausted",
                status=503,
                code="retry_budget_exhausted",
                retry_after=self.admission.retry_after,
            )
        return await self._open(call)

    async def _open(self, call: Call) -> tuple[UnitState, Answer]:
        t = self.config.timeouts
        # A non-streamed answer's first byte comes when it is complete: only `total` bounds it.
        call.first_byte = t.first_byte if call.info.stream else t.total
        races = self.races
        try:
            if races is not None and call.attempts == 0 and races.hedger.eligible(call):
                return await races.run(call)
            # `_attempt`, written out: a coroutine fewer for every request's first attempt.
            unit = await self.admit(call)
            return await self.send(call, unit, call.lease, call.placed, call.routed)
        except UpstreamError as exc:
            if not self._may_retry(exc, 1, call):
                raise
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.config.retry.max_attempts - 1),
            retry=lambda rs: self._may_retry(_failure(rs), rs.attempt_number + 1, call),
            wait=wait_none(),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._attempt(call)
        raise AssertionError("unreachable: tenacity re-raises the last failure")

    async def _attempt(self, call: Call) -> tuple[UnitState, Answer]:
        unit = await self.admit(call)
        return await self.send(call, unit, call.lease, call.placed, call.routed)

    def cached(self, call: Call, units: Sequence[UnitState]) -> Mapping[str, int]:
        """How many of the call's prompt tokens each of `units`' caches holds, where the
        gateway knows both (else nothing)."""
        if call.prompt_ids is None or self.depths is None:
            return {}
        return self.depths(call.prompt_ids, (u.id for u in units))

    def soonest(self, call: Call, units: Sequence[UnitState]) -> float | None:
        """The least time to first token the forecast gives the call on any of `units`, each
        with its cached prefix and its requests in flight (Forecast.ttft: predicted, or
        observed before a unit's model is learned); None: no forecast, or nothing known."""
        forecast = self.forecast
        if forecast is None or not units:
            return None
        prompt, cached = self.prompt_tokens(call), self.cached(call, units)
        best: float | None = None
        for u in units:
            uncached = max(0, prompt - cached.get(u.id, 0))
            ttft = forecast.ttft(u.id, uncached, u.inflight + u.foreign)
            if ttft is not None and (best is None or ttft < best):
                best = ttft
        return best

    def prompt_tokens(self, call: Call) -> int:
        """The request's prompt tokens: counted where the gateway knows its ids, else about
        four bytes of JSON a token (and at least that where the ids are an earlier turn's,
        only where the prompt begins)."""
        by_bytes = len(call.send_body) // BYTES_PER_TOKEN
        ids = call.prompt_ids
        if ids is None:
            return by_bytes
        return max(len(ids), by_bytes) if call.partial else len(ids)

    async def send(
        self,
        call: Call,
        unit: UnitState,
        lease: Lease,
        placed: Placed | None,
        routed: str,
        on_head: Callable[[int], None] | None = None,
    ) -> tuple[UnitState, Answer]:
        """One attempt on `unit`, whose slot `lease` holds, placed as `placed` (the forecast's
        view; each observer reads it from the call as the attempt's events come). With
        `on_head`, a tied copy: marked so, and `on_head` hears its head's status."""
        loop = self._loop or self._bind_loop()
        if lease is call.lease and call.attempts == 0 and self.hedger is not None:
            held = 0 if placed is None else placed.cached
            tokens = max(self.prompt_tokens(call) - held, 0)
            self.hedger.hedging.prefill(tokens, loop.time())
            self.signals.prefill_counted(call, tokens)
        call.attempts += 1
        call.placed, call.routed = placed, routed
        self.signals.attempt_started(call, unit)
        started = loop.time()
        served = unit.config.served_model
        body = call.send_body
        if served and body:  # a body-less request (a GET) names no model
            body = for_unit(body, served)
        if call.unit_priority is not None and unit.config.takes_priority and body:
            body = with_priority(body, call.unit_priority)
        try:
            first_byte_at = min(started + call.first_byte, call.deadline)
            answer = await self.upstream.open(
                unit.id,
                unit.leader,
                call.send_path,
                body,
                call.rid,
                first_byte_at,
                call.traceparent,
                unit.extra_head if on_head is None else unit.extra_head + TIED_LINE,
                unit.config,
                call.method,
                on_head,
            )
        except BaseException as exc:
            lease.drop()
            call.placed, call.routed = placed, routed
            if self.hedger is not None:
                self.hedger.hedging.attempted(isinstance(exc, UpstreamError), loop.time())
            if isinstance(exc, UpstreamError):
                call.tried.append(unit)
                call.last_error = exc
                self.signals.attempt_failed(call, unit, exc, started)
            elif isinstance(exc, asyncio.CancelledError):
                self.signals.attempt_cancelled(call, unit)
            raise  # anything else (the client left: CancelledError) ends the request
        call.send_body = b""  # answered: no retry sends it again (a continuation has its own)
        call.prompt_ids = None  # placed: routing needs them no more
        if served:
            answer.names = Renamer(served, call.info.model)
        answer.placed, answer.routed = placed, routed
        call.placed, call.routed = placed, routed
        if self.hedger is not None:
            self.hedger.hedging.attempted(False, loop.time())
        self.signals.attempt_opened(call, unit, answer.status)
        return unit, answer

    async def admit(self, call: Call) -> UnitState:
        def pick() -> UnitState | None:
            routable = self.routable(call)
            if not routable or all(u in call.tried for u in routable):
                if call.last_error is not None:
                    raise call.last_error  # every unit tried: the last failure is the answer
                raise Overloaded(
                    _none_routable(call),
                    status=503,
                    code="no_routable_unit",
                    retry_after=self.admission.retry_after,
                )
            cached = None
            if call.prompt_ids is not None and self.depths is not None:
                cached = self.depths(call.prompt_ids, (u.id for u in routable))
            forecast = self.forecast
            if forecast is None:
                prompt = self.prompt_tokens(call) if cached else 0
                unit, how = self.place(call, routable, cached, prompt)
                call.routed = "home" if call.home is not None else how
                return unit
            return self._timely(call, forecast, routable, cached or {})

        loop = self._loop or self._bind_loop()
        asked = loop.time()
        try:
            unit = await call.lease.take(pick)
        except Overloaded as exc:
            self.signals.rejected(call, exc.code or "overloaded")
            raise
        self.signals.admitted(call, loop.time() - asked)
        return unit

    def _timely(
        self,
        call: Call,
        forecast: Forecast,
        routable: Sequence[UnitState],
        cached: Mapping[str, int],
    ) -> UnitState | None:
        """Placed by the forecast where it applies: the request's prompt ids are known (the
        units' caches scored exactly), or no affinity key asks for a unit (an approximate
        prefix key keeps its locality, a session its unit). The placement is left on the
        call for the forecast's feed, with the unit's predicted TTFT."""
        ids = call.prompt_ids
        prompt = self.prompt_tokens(call)
        slo, shed = self.slos.get(call.lease.ask.klass, (None, False))
        estimates = None
        free = ids is not None or call.key is None  # no affinity asks for a unit
        if self.by_latency and free and self.rng.random() >= EXPLORE:
            running = ((u.id, u.inflight + u.foreign) for u in routable)
            estimates = forecast.estimates(running, prompt, cached)
        unit, how = self.place(call, routable, cached, prompt, estimates, slo)
        if unit is None:
            return None
        call.routed = "home" if call.home is not None else how
        held = cached.get(unit.id, 0)
        if estimates is not None:
            predicted: float | None = estimates[unit.id].ttft
        else:
            estimate = forecast.estimate(unit.id, prompt - held, unit.inflight + unit.foreign)
            predicted = estimate.ttft if estimate is not None else None
        if shed and slo is not None and predicted is not None and predicted > slo:
            raise Overloaded(
                f"every unit is predicted to miss the class's time to first token of {slo:g} s"
                f" (the soonest: {predicted:.3g} s)",
                status=429,
                code="ttft_slo",
                retry_after=self.admission.retry_after,
            )
        call.placed = Placed(unit.id, prompt, held, predicted)
        return unit

    def place(
        self,
        call: Call,
        routable: Sequence[UnitState],
        cached: Mapping[str, int] | None,
        prompt: int,
        estimates: Mapping[str, Estimate] | None = None,
        slo: float | None = None,
    ) -> tuple[UnitState | None, str]:
        """balance.place with this gateway's load bounds (the first attempt's, a retry's, a
        hedge's second copy's): `prompt` tokens, of which `cached` says how many each unit
        holds."""
        r = self.config.routing
        return place(
            routable,
            call.tried,
            call.key,
            r.bounded_load_factor,
            self.rng,
            cached,
            estimates,
            slo,
            prompt=prompt,
            cached_factor=r.cached_load_factor,
        )

    def routable(self, call: Call) -> tuple[UnitState, ...]:
        """The model's routable units, narrowed to those that serve the call's API; or the
        call's home, the one unit that can answer it (stored.py), while it is alive (draining
        or disabled too: its stored responses are nowhere else)."""
        home = call.home
        if home is not None:
            return (home,) if home.healthy and self.units.units.get(home.id) is home else ()
        canary = self.units.canary
        if canary is None:
            routable = self.units.snapshot.get(call.info.model, ())
        else:
            routable = self._revision(call, canary)
        path = call.send_path
        if path in RESUMABLE or all(path in u.serves for u in routable):
            return routable  # every kind serves chat and completions
        return tuple(u for u in routable if path in u.serves)

    def _revision(self, call: Call, canary: Canary) -> tuple[UnitState, ...]:
        """The units of the revision the call drew, in the cell a rollout is moving (its
        retries and resumptions stay with it: the draw is kept on the call)."""
        if call.draw < 0:
            call.draw = draw(canary.id, call.session, self.rng)
        routable = self.units.routable(call.info.model, call.draw < canary.share)
        keep = call.keep_revision
        return routable if keep is None else tuple(u for u in routable if u.revision == keep)

    def _may_retry(self, exc: BaseException | None, attempts: int, call: Call) -> bool:
        if not isinstance(exc, UpstreamError) or not exc.retryable:
            return False
        if attempts >= self.config.retry.max_attempts:
            return False
        if all(u in call.tried for u in self.routable(call)):
            return False  # nowhere else to go: do not spend budget
        if not self.budget.withdraw(asyncio.get_running_loop().time()):
            self.signals.budget_exhausted()
            return False
        self.signals.retried(exc.kind)
        return True


def _none_routable(call: Call) -> str:
    if call.home is not None:
        return f"unit '{call.home.id}', the one that can answer this request, is not healthy now"
    at = "" if call.send_path in RESUMABLE else f" at {call.send_path}"
    return f"no routable unit serves model '{call.info.model}'{at}"


def _failure(rs: RetryCallState) -> BaseException | None:
    return rs.outcome.exception() if rs.outcome is not None else None
