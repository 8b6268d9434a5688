"""How a request's attempts and streams end: closed sets, carried on results and errors.

The breaker's classifier (health/classify.py), the resume decision, the metrics and the SSE
error events all branch on these; strings would let a typo create a new, silently unhandled
outcome. The values are the wire and label names, unchanged (StrEnum compares equal to them).
"""

from __future__ import annotations

from enum import StrEnum


class Failure(StrEnum):
    """Why an attempt at a unit failed before its first byte (errors.UpstreamError.kind)."""

    CONNECT = "connect"  # refused, unreachable: nothing listens
    CONNECT_TIMEOUT = "connect_timeout"  # no handshake in time: down, or its accept queue full
    RESET = "reset"
    STATUS = "status"  # a 5xx answer
    FIRST_BYTE_TIMEOUT = "first_byte_timeout"
    PROTOCOL = "protocol"  # not HTTP
    LOCAL = "local"  # the gateway's own resources ran out (open files), not the unit

    @property
    def timeout(self) -> bool:
        return self in (Failure.CONNECT_TIMEOUT, Failure.FIRST_BYTE_TIMEOUT)

    @property
    def message(self) -> str:
        """What the client is told: the kind of failure, never the unit's address or the
        OS's error text (those are logged)."""
        return _FAILURES[self]


_FAILURES = {
    Failure.CONNECT: "upstream connect failed",
    Failure.CONNECT_TIMEOUT: "upstream connect timed out",
    Failure.RESET: "the upstream connection broke before the answer began",
    Failure.STATUS: "the unit answered with a server error",
    Failure.FIRST_BYTE_TIMEOUT: "the unit timed out before the first byte",
    Failure.PROTOCOL: "the unit's answer was not valid HTTP",
    Failure.LOCAL: "the gateway's own upstream capacity ran out",
}


class End(StrEnum):
    """How one relayed answer ended (relay.StreamRelay.pump)."""

    COMPLETE = "complete"
    CLIENT_GONE = "client_gone"
    RESET = "reset"
    IDLE_TIMEOUT = "idle_timeout"
    TOTAL_TIMEOUT = "total_timeout"
    TRUNCATED = "truncated"  # a clean end of the body without [DONE]
    UNIT_ERROR = "unit_error"  # an error event from the unit
    UNIT_EJECTED = "unit_ejected"  # the gateway broke it: the unit was ejected, then quiet
    SHUTDOWN = "shutdown"

    @property
    def message(self) -> str:
        """What the client's SSE error event says when the stream cannot go on."""
        return _MESSAGES.get(self, self.value)


_MESSAGES = {
    End.RESET: "the unit's connection broke mid-stream",
    End.IDLE_TIMEOUT: "the unit sent nothing for too long",
    End.TOTAL_TIMEOUT: "the answer exceeded the total time limit",
    End.TRUNCATED: "the unit ended the stream before the answer was complete",
    End.UNIT_ERROR: "the unit failed mid-stream",
    End.UNIT_EJECTED: "the unit was ejected by its health checks mid-stream",
    End.SHUTDOWN: "the gateway is shutting down",
}


class Resumption(StrEnum):
    """What became of a stream that broke after its first byte (the resume phase's verdict;
    the `outcome` label of unitgate_resumptions_total, the events log's resume_<value>)."""

    OK = "ok"  # continued on another unit
    GAVE_UP = "gave_up"  # could have been, but the limit, the budget or the units said no
    UNSUPPORTED = "unsupported"  # its unit returns no token ids: it cannot be continued
