"""A key's limits on the request path: admitted after intake, settled when the request ends.

The limiter (gateway/limits) decides; this module asks it for the caller's key, turns a
refusal into the client's 429 (`rate_limit_exceeded`, with Retry-After and the
x-ratelimit-* headers, in OpenAI's shape), and settles the grant with what the request really
used: the answer's usage when known (a client that left is charged what its stream carried),
nothing when no unit ever answered it, else the admission's estimate.
"""

from __future__ import annotations

import time

from gateway.errors import GatewayError
from gateway.limits.decisions import Grant, Refusal
from gateway.limits.limiter import Limiter
from gateway.proxy.call import Call


class RateLimited(GatewayError):
    """429: the key is over one of its limits."""

    status = 429

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message, code=refusal.code)
        # OpenAI's own type for these: which limit ("requests" or "tokens").
        self.type = "tokens" if refusal.dim == "tokens" else "requests"
        self.refusal = refusal

    def headers(self) -> dict[str, str]:
        return self.refusal.headers()


def limited(call: Call) -> bool:
    """Whether the request's key has limits to hold it to (`admit` has work to do)."""
    caller = call.caller
    return caller.key_id is not None and caller.limits.any()


async def admit(limiter: Limiter, call: Call) -> None:
    """Hold the request to its key's limits; RateLimited if over one. A caller without a key,
    or a key without limits, costs nothing here (the handler asks `limited` first)."""
    if not limited(call):
        return
    caller = call.caller
    assert caller.key_id is not None
    answer = await limiter.admit(caller.key_id, caller.limits, call.lease.ask.tokens, time.time())
    if isinstance(answer, Refusal):
        raise RateLimited(answer)
    call.grant = answer


def settle(limiter: Limiter, call: Call) -> None:
    grant: Grant | None = call.grant
    if grant is None:
        return
    if call.usage is not None:
        used = call.usage.prompt + call.usage.completion
    elif call.unit is None:
        used = 0  # refused or failed before any unit answered: nothing was generated
    else:
        used = grant.tokens  # answered, but without a count: the estimate stands
    limiter.settle(grant, used)
