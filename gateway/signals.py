"""The request path's lifecycle, as signals its observers subscribe to.

The request path says what happened (an attempt started, failed or was answered, the first
byte came, a stream broke, it was resumed, the request ended) and nothing else: metrics,
tracing, the events log, the logs and the breaker's feed subscribe (as aiohttp's tracing
signals do), so none of them reaches into the path and the path imports none of them. Hooks
run synchronously on the event loop, in the request's own task, once per event, never per
token: the one per-token sink (`token_gaps`) is asked for once per answer and handed to the
relay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from gateway.errors import UpstreamError
from gateway.outcomes import End, Failure, Resumption
from gateway.relay.pace import GapSink
from gateway.units import UnitState

# The request as the path hands it to its observers: proxy/call.py's Call. Observers declare
# what they read of it (`Observer[Call]`, or a protocol of the few fields they need), so this
# module and the observers below the proxy (health's breaker feed) import nothing of it.
C_contra = TypeVar("C_contra", contravariant=True)
T = TypeVar("T")


class _Discard:
    __slots__ = ()
    bounds: tuple[float, ...] = ()

    def observe(self, value: float) -> None:
        pass

    def merge(self, counts: list[int], total: float) -> None:
        pass


DISCARD = _Discard()


class Observer(Generic[C_contra]):
    """One subscriber: override the hooks it needs; the others do nothing.

    Every hook but `rejected`, `retried` and `budget_exhausted` gets the request's Call; an
    observer keeps per-request state in it only through `call.trace` (the tracing observer's
    slot), never in its own tables, so nothing leaks when a request ends abnormally."""

    def received(self, call: C_contra) -> None:
        """A request arrived (its path, id, headers and arrival time are known)."""

    def validated(self, call: C_contra) -> None:
        """Intake accepted it: its body, model and routing key are known."""

    def rejected(self, call: C_contra, code: str) -> None:
        """Admission said no: `saturated` (429) or `no_routable_unit` (503)."""

    def admitted(self, call: C_contra, waited: float) -> None:
        """Admission gave the call a slot (in its class: `call.lease.ask`) after `waited` s."""

    def attempt_started(self, call: C_contra, unit: UnitState) -> None:
        """An attempt at `unit` is about to be sent (`call.attempts` counts it)."""

    def attempt_opened(self, call: C_contra, unit: UnitState, status: int) -> None:
        """`unit` answered the attempt in time, with `status` (its first bytes are in hand)."""

    def attempt_failed(
        self, call: C_contra, unit: UnitState, error: UpstreamError, started: float
    ) -> None:
        """An attempt at `unit` failed before its first byte (`started`: loop time)."""

    def attempt_cancelled(self, call: C_contra, unit: UnitState) -> None:
        """An attempt at `unit` was cancelled before its first byte: the client left, or a
        hedge's other copy answered first."""

    def prefill_counted(self, call: C_contra, tokens: int) -> None:
        """The request's first attempt goes out with `tokens` uncached prompt tokens, which
        the hedge budget's base counts (with hedging on)."""

    def hedged(self, call: C_contra, first: UnitState, second: UnitState, tokens: int) -> None:
        """`first` had not answered in time: a second copy of the request goes to `second`
        (`tokens`: its uncached prompt tokens, the budget's cost)."""

    def hedge_refused(self, call: C_contra, reason: str) -> None:
        """`first` had not answered in time, but no second copy goes (`reason`: "budget: ...",
        "overloaded: ..." or "no_unit: ...")."""

    def hedge_ended(
        self, call: C_contra, winner: UnitState, loser: UnitState, second: bool, wasted: int
    ) -> None:
        """Of a hedged request's two copies, `winner`'s answer began first (`second`: the
        second copy's); `loser`'s was cancelled (`wasted`: its uncached prompt tokens)."""

    def retried(self, kind: Failure) -> None:
        """A failed attempt is sent again, elsewhere, paid from the retry budget."""

    def budget_exhausted(self) -> None:
        """A retry or resumption was refused by the retry budget."""

    def first_byte(self, call: C_contra, unit: UnitState, ttft: float) -> None:
        """The answer's first bytes came, `ttft` seconds after the request arrived."""

    def answer_ended(self, call: C_contra, unit: UnitState, end: End, gap: float | None) -> None:
        """One answer from `unit` ended (a request's, or a continuation's): `gap` is the
        stream's own gap estimate (None for a non-streamed answer)."""

    def resumed(self, call: C_contra, broken: UnitState, outcome: Resumption, detail: str) -> None:
        """A stream broken on `broken` was continued elsewhere (`ok`) or ended
        (`gave_up`, `unsupported`)."""

    def ended(self, call: C_contra) -> None:
        """The request is over, once, whatever ended it: `call.status` is what the client
        got (None if it never got a status), `call.unit` who served it (None: refused before
        any unit answered), `call.error` the exception that ended it instead (a
        CancelledError when the client went away mid-request)."""

    def token_gaps(self, unit_id: str) -> GapSink | None:
        """Where the relay records the gaps between one unit's chunks (the hot path)."""
        return None


# The hooks `Signals` fans out (token_gaps apart: it asks until one answers).
_HOOKS = (
    "received",
    "validated",
    "rejected",
    "admitted",
    "attempt_started",
    "attempt_opened",
    "attempt_failed",
    "attempt_cancelled",
    "prefill_counted",
    "hedged",
    "hedge_refused",
    "hedge_ended",
    "retried",
    "budget_exhausted",
    "first_byte",
    "answer_ended",
    "resumed",
    "ended",
)


class Signals(Observer[T]):
    """Fans every hook out to the subscribers that implement it, in subscription order (a
    hook an observer leaves as Observer's no-op is not called: most observers need two or
    three of the eighteen, and each runs for every request)."""

    def __init__(self) -> None:
        self._observers: list[Observer[T]] = []
        self._received: tuple[Callable[[T], None], ...] = ()
        self._validated: tuple[Callable[[T], None], ...] = ()
        self._rejected: tuple[Callable[[T, str], None], ...] = ()
        self._admitted: tuple[Callable[[T, float], None], ...] = ()
        self._attempt_started: tuple[Callable[[T, UnitState], None], ...] = ()
        self._attempt_opened: tuple[Callable[[T, UnitState, int], None], ...] = ()
        self._attempt_failed: tuple[Callable[[T, UnitState, UpstreamError, float], None], ...] = ()
        self._attempt_cancelled: tuple[Callable[[T, UnitState], None], ...] = ()
        self._prefill_counted: tuple[Callable[[T, int], None], ...] = ()
        self._hedged: tuple[Callable[[T, UnitState, UnitState, int], None], ...] = ()
        self._hedge_refused: tuple[Callable[[T, str], None], ...] = ()
        self._hedge_ended: tuple[Callable[[T, UnitState, UnitState, bool, int], None], ...] = ()
        self._retried: tuple[Callable[[Failure], None], ...] = ()
        self._budget_exhausted: tuple[Callable[[], None], ...] = ()
        self._first_byte: tuple[Callable[[T, UnitState, float], None], ...] = ()
        self._answer_ended: tuple[Callable[[T, UnitState, End, float | None], None], ...] = ()
        self._resumed: tuple[Callable[[T, UnitState, Resumption, str], None], ...] = ()
        self._ended: tuple[Callable[[T], None], ...] = ()

    def subscribe(self, observer: Observer[T]) -> None:
        self._observers.append(observer)
        for name in _HOOKS:
            if getattr(type(observer), name) is not getattr(Observer, name):
                hooks = getattr(self, "_" + name)
                setattr(self, "_" + name, (*hooks, getattr(observer, name)))

    def received(self, call: T) -> None:
        for hook in self._received:
            hook(call)

    def validated(self, call: T) -> None:
        for hook in self._validated:
            hook(call)

    def rejected(self, call: T, code: str) -> None:
        for hook in self._rejected:
            hook(call, code)

    def admitted(self, call: T, waited: float) -> None:
        for hook in self._admitted:
            hook(call, waited)

    def attempt_started(self, call: T, unit: UnitState) -> None:
        for hook in self._attempt_started:
            hook(call, unit)

    def attempt_opened(self, call: T, unit: UnitState, status: int) -> None:
        for hook in self._attempt_opened:
            hook(call, unit, status)

    def attempt_failed(
        self, call: T, unit: UnitState, error: UpstreamError, started: float
    ) -> None:
        for hook in self._attempt_failed:
            hook(call, unit, error, started)

    def attempt_cancelled(self, call: T, unit: UnitState) -> None:
        for hook in self._attempt_cancelled:
            hook(call, unit)

    def prefill_counted(self, call: T, tokens: int) -> None:
        for hook in self._prefill_counted:
            hook(call, tokens)

    def hedged(self, call: T, first: UnitState, second: UnitState, tokens: int) -> None:
        for hook in self._hedged:
            hook(call, first, second, tokens)

    def hedge_refused(self, call: T, reason: str) -> None:
        for hook in self._hedge_refused:
            hook(call, reason)

    def hedge_ended(
        self, call: T, winner: UnitState, loser: UnitState, second: bool, wasted: int
    ) -> None:
        for hook in self._hedge_ended:
            hook(call, winner, loser, second, wasted)

    def retried(self, kind: Failure) -> None:
        for hook in self._retried:
            hook(kind)

    def budget_exhausted(self) -> None:
        for hook in self._budget_exhausted:
            hook()

    def first_byte(self, call: T, unit: UnitState, ttft: float) -> None:
        for hook in self._first_byte:
            hook(call, unit, ttft)

    def answer_ended(self, call: T, unit: UnitState, end: End, gap: float | None) -> None:
        for hook in self._answer_ended:
            hook(call, unit, end, gap)

    def resumed(self, call: T, broken: UnitState, outcome: Resumption, detail: str) -> None:
        for hook in self._resumed:
            hook(call, broken, outcome, detail)

    def ended(self, call: T) -> None:
        for hook in self._ended:
            hook(call)

    def token_gaps(self, unit_id: str) -> GapSink:
        """The first subscriber's sink (one per answer, asked once), else one that discards."""
        for o in self._observers:
            sink = o.token_gaps(unit_id)
            if sink is not None:
                return sink
        return DISCARD
