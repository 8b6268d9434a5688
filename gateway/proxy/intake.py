"""Intake, the request path's first phase: read the body, validate it, decide how to route it.

What the gateway itself must refuse is found here, before any unit is involved, and raised as
an InvalidRequest the handler turns into the client's 4xx: a body too large or too slow, not
JSON (by its content type too, as vLLM refuses it), a model it does not serve, a bad `stream`
flag (validation.py). The rest of the body is the unit's to judge. A valid request leaves with
what the later phases need on its call: the routing key, the body to send (the client's own
bytes, naming the model it was routed to), and the tracker if its stream can be resumed.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gateway.auth.caller import Caller
from gateway.config import Config
from gateway.kvevents.turns import keys
from gateway.paths import RESPONSES_PATH, RESUMABLE
from gateway.proxy.call import Call
from gateway.proxy.continuation import (
    asking_token_ids,
    asking_usage,
    carried_exactly,
    resumable,
)
from gateway.proxy.exchange import Exchange
from gateway.proxy.mediatype import require_json
from gateway.proxy.names import with_model
from gateway.proxy.priority import ask_of, refuse_own_priority
from gateway.proxy.stored import StoredResponses
from gateway.proxy.validation import RequestInfo, Served, parse_body
from gateway.relay.tracker import StreamTracker
from gateway.routing.admission import one_class
from gateway.routing.affinity import affinity_key

if TYPE_CHECKING:
    from gateway.kvevents.prompts import Prompts
    from gateway.kvevents.turns import Turns

Validator = Callable[[dict[str, Any], Served, int], RequestInfo]

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class _RequestIds:
    """New request ids: 24 hex digits, a random half per process and a counter. Unique without
    a system call per request (secrets.token_hex asked the kernel for random bytes each time);
    an id correlates logs, traces and answers, it guards nothing, so it need not be secret."""

    def __init__(self) -> None:
        self._reseed()
        os.register_at_fork(after_in_child=self._reseed)  # a forked child gets its own half

    def _reseed(self) -> None:
        self._prefix = secrets.token_hex(6)
        self._count = itertools.count(secrets.randbits(32))

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._count) & 0xFFFFFFFFFFFF:012x}"


_new_id = _RequestIds()


def request_id(headers: Mapping[str, str]) -> str:
    """The client's `x-request-id` when it is a sane one (it is echoed and logged), else new."""
    rid = headers.get("x-request-id", "")
    return rid if _REQUEST_ID.fullmatch(rid) else _new_id()


class Intake:
    def __init__(
        self,
        config: Config,
        stored: StoredResponses,
        prompts: Prompts | None = None,
        turns: Turns | None = None,
    ) -> None:
        self.config = config
        self.stored = stored  # which unit holds which stored response
        # Each model's tokenizer, for a prompt's ids (None: routing by the prefix hash only)
        self.prompts = prompts
        # Conversations' earlier turns' prompt ids, for a model without a tokenizer
        self.turns = turns
        r = config.routing
        self.prefix_affinity = r.prefix_scorer != "off"
        self.served = Served.of(config.gateway.models, config.gateway.default_model)
        self.priority = config.priority  # None: no classes, every request `standard`
        a = config.admission
        self.classes = config.priority or one_class(a.queue_size, a.queue_timeout)
        self.names = frozenset(c.name for c in self.classes.classes)

    async def __call__(self, call: Call, request: Exchange, validate: Validator) -> None:
        """A client trickling its body (a byte a second) would otherwise hold the connection
        and its buffer forever: reading it is bounded by the request's `total` timeout (408),
        its size by `[gateway].max_body_bytes` (413)."""
        limit, total = self.config.gateway.max_body_bytes, self.config.timeouts.total
        body = await request.body(limit, total)
        require_json(request.headers)
        data = parse_body(body)
        info = validate(data, self.served, self.config.routing.prefix_chars)
        if data.get("model") != info.model:  # left out: the unit gets the routed model's name
            body = with_model(body, data, info.model)
            data["model"] = info.model
        if self.priority is not None:
            refuse_own_priority(data)
        self.ask(call, request, data, len(body))
        if call.path == RESPONSES_PATH:
            previous = data.get("previous_response_id")
            if isinstance(previous, str) and previous:  # it continues a stored response
                call.home = await self.stored.home(previous, info.model, call.rid)
        session = call.session = request.headers.get("x-session-id") or info.user
        mode = self.config.routing.affinity
        key = affinity_key(mode, session, info.prefix if self.prefix_affinity else "")
        sessioned = bool(session and "session" in mode)
        if self.prompts is not None and not sessioned:
            # Session affinity wins; else the units' caches are asked first (dispatch.py).
            ids = self.prompts.ids(info.model, call.chat, data)
            call.prompt_ids = ids if ids else None
        turns = self.turns  # (a session's turns go to its unit: nothing to look up)
        if turns is not None and turns.active and call.chat and not sessioned:
            self.earlier_turn(call, data.get("messages"))
        self.accept(call, info, key, body, data)

    def earlier_turn(self, call: Call, messages: object) -> None:
        """Without a tokenizer for the model: the key its prompt ids are kept under for the
        next turn (proxy/turns_feed.py keeps them once its unit said them), and the prompt
        ids of the conversation's earlier turn, where it continues one this gateway served
        (where its prompt begins)."""
        if call.prompt_ids is not None:
            return  # known exactly, from the model's tokenizer
        assert self.turns is not None
        call.turn, earlier = keys(messages)
        if earlier is not None:
            found = self.turns.get(earlier)
            if found is not None:
                call.prompt_ids, call.partial = found, True

    def ask(self, call: Call, request: Exchange, data: dict[str, Any], size: int) -> None:
        """What the request asks of admission: its class, its tenant, its size."""
        caller = call.caller
        ask = ask_of(request.headers, data, size, self.classes, caller.tenant, *self.clamp(caller))
        call.lease.ask = ask
        if self.priority is not None:
            call.unit_priority = self.priority.get(ask.klass).unit_priority

    def bodiless(self, call: Call, request: Exchange, info: RequestInfo) -> None:
        """A request without a body to read (a GET, a stored response's cancel): what it
        asks for is known from its route (`call.method`, `send_path` and `home` are set)."""
        self.ask(call, request, {}, 0)
        call.accept(info, None, None, b"", {})

    def accept(
        self, call: Call, info: RequestInfo, key: int | None, body: bytes, data: dict[str, Any]
    ) -> None:
        """The request is valid: with its stream tracked if it can be resumed."""
        if self.config.resume.enabled and call.path in RESUMABLE and resumable(data, call.chat):
            asked = _usage(data)
            # Where the gateway predicted the prompt's cached tokens (its ids are known), the
            # unit's usage says how many it really held: asked for, read, and not relayed
            # unless the client asked too.
            reads = call.prompt_ids is not None
            tracker = StreamTracker(call.chat, data.get("return_token_ids") is True, asked, reads)
            send = asking_token_ids(body, data)
            if reads and not asked:
                send = asking_usage(send, data)
            call.accept(info, key, tracker, send, carried_exactly(body, data))
        else:
            call.accept(info, key, None, body, {})

    def clamp(self, caller: Caller) -> tuple[str | None, str]:
        """The caller's highest and default class, as this gateway's classes know them: a key
        made for a class the config has since dropped runs in `[priority].default`, at most."""
        names = self.names
        highest = caller.highest
        if highest is not None and highest not in names:
            highest = self.classes.default
        default = caller.default if caller.default in names else ""
        return highest, default


def _usage(data: dict[str, Any]) -> bool:
    options = data.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True
