"""The access log: one line per request, as a subscriber to the request path's signals.

Logged at INFO under `unitgate.access` (route or silence it by that name) when `[logging]
access` is true; when it is false nothing subscribes, so the request path pays nothing. Every
field comes from the Call as it ended (what the metrics observer reads too): the line is
written from `ended`, once per request, whatever ended it. In workers mode each worker logs
the requests it served.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.config import LoggingConfig
from gateway.errors import UpstreamError
from gateway.proxy.call import Call
from gateway.signals import Observer, Signals

ACCESS_LOGGER = "unitgate.access"
log = logging.getLogger(ACCESS_LOGGER)


class AccessLog(Observer[Call]):
    def __init__(self, logger: logging.Logger = log) -> None:
        self.log = logger

    def ended(self, call: Call) -> None:
        if not self.log.isEnabledFor(logging.INFO):
            return
        fields = access_fields(call, asyncio.get_running_loop().time())
        self.log.info("request", extra=fields)


def subscribe(signals: Signals[Call], config: LoggingConfig) -> AccessLog | None:
    """Subscribe the access log if `[logging] access` asks for it (else subscribe nothing).
    Its lines are INFO: a gateway run at `--log-level warning` still writes them unless the
    `unitgate.access` logger is given a level of its own."""
    if not config.access:
        return None
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    observer = AccessLog()
    signals.subscribe(observer)
    return observer


def access_fields(call: Call, now: float) -> dict[str, Any]:
    """The access line's fields for a request that ended at loop time `now`."""
    usage = call.usage
    info = getattr(call, "info", None)  # unset when the request was refused at intake
    return {
        "request_id": call.rid,
        "method": call.method,
        "path": call.path,
        "model": None if info is None else info.model,
        "unit": _unit(call),
        "status": call.status,
        "outcome": outcome(call),
        "ttft": _ttft(call),
        "duration": round(now - call.start, 6),
        "prompt_tokens": None if usage is None else usage.prompt,
        "completion_tokens": None if usage is None else usage.completion,
        "attempts": call.attempts,
        "hedge": call.hedge or None,  # which copy of a hedged request answered
    }


def outcome(call: Call) -> str:
    """How the request ended, in one word: the answer's end (`complete`, `reset`, ...), the
    upstream failure that was answered (`upstream_connect`, ...), or the refusal."""
    if isinstance(call.error, asyncio.CancelledError):
        return "client_gone"
    if call.error is not None or call.status is None:
        return "error"
    if call.end is not None:
        return call.end.value
    error = _answered_failure(call)
    if error is not None:
        return f"upstream_{error.kind}"
    if call.status == 429:
        return "saturated"
    if call.status >= 500:
        return "unavailable"
    return "invalid_request"


def _unit(call: Call) -> str | None:
    """The unit that served the answer, or whose failure was the answer (None: refused)."""
    if call.unit is not None:
        return call.unit.id
    error = _answered_failure(call)
    return None if error is None else error.unit_id


def _answered_failure(call: Call) -> UpstreamError | None:
    """The unit failure the client was answered with, if that is how the request ended."""
    error = call.last_error
    if call.end is None and error is not None and error.status == call.status:
        return error
    return None


def _ttft(call: Call) -> float | None:
    """Seconds to the first token: only for a streamed answer that produced one."""
    ttft = call.ttft
    if ttft is None or call.status != 200:
        return None
    if call.usage is not None and call.usage.completion == 0:
        return None
    return round(ttft, 6)
