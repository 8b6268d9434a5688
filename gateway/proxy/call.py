"""One client request, from arrival to its last byte: the object every phase of the path reads.

The handler (handler.py) creates it on arrival and is its one owner: it runs the phases in
order (intake, dispatch, then relay and resumption for a stream) and ends it. Everything a
phase learns goes onto the call instead of travelling beside it, so a phase's signature is
"the call" and the observers (signals.py) see the same object the phases do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.auth.caller import ANONYMOUS, Caller
from gateway.errors import UpstreamError
from gateway.limits.decisions import Grant
from gateway.outcomes import End
from gateway.paths import CHAT_PATH, COMPLETIONS_PATH
from gateway.proxy.lease import Lease
from gateway.proxy.validation import RequestInfo
from gateway.relay.tracker import StreamTracker
from gateway.relay.usage import Usage
from gateway.routing.forecast import Placed
from gateway.units import UnitState


class Call:
    __slots__ = (
        "attempts",
        "caller",
        "carried",
        "deadline",
        "draw",
        "end",
        "error",
        "first_byte",
        "grant",
        "headers",
        "hedge",
        "home",
        "info",
        "keep_revision",
        "key",
        "last_error",
        "lease",
        "method",
        "partial",
        "path",
        "placed",
        "prompt_ids",
        "rid",
        "routed",
        "send_body",
        "send_path",
        "session",
        "start",
        "status",
        "trace",
        "traceparent",
        "tracker",
        "tried",
        "ttft",
        "turn",
        "unit",
        "unit_priority",
        "usage",
    )

    # Set by intake (`accept`) once the body is read and valid; reading them earlier is a bug
    # and fails loudly (AttributeError) instead of routing on a placeholder.
    # What a continuation takes from the request (continuation.carried): a resumable stream's.
    carried: dict[str, Any]
    info: RequestInfo
    key: int | None

    def __init__(
        self,
        path: str,
        rid: str,
        headers: Mapping[str, str],
        start: float,
        deadline: float,
        lease: Lease,
    ) -> None:
        self.path, self.rid, self.headers = path, rid, headers
        self.start = start  # loop time of its arrival
        self.deadline = deadline  # loop time by which its answer must be over
        self.lease = lease  # the admission slot of the unit serving it now, if any
        self.caller: Caller = ANONYMOUS  # who it is from (its API key), set before intake
        self.grant: Grant | None = None  # what its key's limits admitted (proxy/quota.py)
        self.tracker: StreamTracker | None = None  # a resumable stream's token bookkeeping
        # Its prompt's token ids as a unit computes them, where the gateway knows them and
        # units report their caches (kvevents): routing's, until an attempt is answered.
        self.prompt_ids: Sequence[int] | None = None
        # Whether those are only where its prompt begins: an earlier turn's (kvevents/turns.py).
        self.partial = False
        # The key its prompt ids are kept under for the conversation's next turn, if they are.
        self.turn: bytes | None = None
        # Its conversation (the session affinity reads), where it names one: a rollout gives
        # a conversation one revision. `draw`: its draw in the rollout (revisions.py; -1 until
        # a rollout asks); `keep_revision`: the only revision its stream may resume on.
        self.session: str | None = None
        self.draw = -1.0
        self.keep_revision: str | None = None
        # The current attempt's placement, as the latency forecast sees it (dispatch.py).
        self.placed: Placed | None = None
        # How the current attempt's unit was chosen (routing/balance.py's `place`, or "home").
        self.routed = ""
        # Which copy of a hedged request the client got ("first", "second"; "" unhedged).
        self.hedge = ""
        # What the next attempt sends: the client's own request, or a continuation of it.
        self.method = "POST"  # GET for a stored response's or the tokenizer's read
        self.send_path = path  # the target on the unit (a stored response's id and query too)
        # The one unit that can answer (the unit holding a stored response: stored.py).
        self.home: UnitState | None = None
        self.send_body = b""
        # The class's `priority` for units that schedule by it (None: no [priority]).
        self.unit_priority: int | None = None
        self.first_byte = 0.0  # an attempt's first-byte timeout (s), set by the dispatcher
        self.attempts = 0
        self.tried: list[UnitState] = []  # units that failed it, not to be tried again
        self.last_error: UpstreamError | None = None
        self.unit: UnitState | None = None  # the unit whose answer the client is getting
        self.end: End | None = None  # how that answer ended
        self.status: int | None = None  # the status the client got, once it is known
        # Seconds from arrival to a streamed answer's first bytes (None: not streamed).
        self.ttft: float | None = None
        self.error: BaseException | None = None  # what ended the request instead, if anything
        self.trace: object = None  # the tracing observer's own state for this request
        self.traceparent: str | None = None  # the next attempt's W3C traceparent, if traced
        # Tokens as the unit reported them in its answer's own events (usage.py), once read.
        self.usage: Usage | None = None

    @property
    def streamed(self) -> bool:
        return self.info.stream

    @property
    def chat(self) -> bool:
        return self.path == CHAT_PATH

    def accept(
        self,
        info: RequestInfo,
        key: int | None,
        tracker: StreamTracker | None,
        send: bytes,
        carried: dict[str, Any],
    ) -> None:
        """Intake's result: the request is valid and what it asks for is known; `send` is
        the body the first attempt carries (the client's, or the client's asking for token
        ids), `carried` what a continuation of its stream would take from it. Neither the
        client's body nor its parsed form is kept: a stream's memory counts at thousands of
        them open, and a long prompt is most of a request."""
        self.info, self.key, self.tracker = info, key, tracker
        self.send_body, self.carried = send, carried

    def continue_with(self, body: bytes, broken: UnitState) -> None:
        """The next attempt continues the stream `broken` was serving, as a plain completion
        (continuation.py): `broken` is not tried again, and earlier attempts' last failure is
        not the continuation's answer."""
        self.send_path, self.send_body = COMPLETIONS_PATH, body
        self.tried.append(broken)
        self.last_error = None
