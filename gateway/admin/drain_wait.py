"""`unitgate admin drain UNIT --wait`: poll the unit until the fleet has drained it.

"Drained" is the admin API's own verdict (`drained: true` in the unit's view): out of service
by the operator and nothing in flight on it, and, where replicas share their state, on every
live replica, each of which has applied the drain. This module only asks, waits and says what
is still keeping the unit busy; the deadline bounds the wait, and the last look may run past it
by at most LOOK_AT_LEAST (and never past the client's own request timeout).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO
from urllib.parse import quote

from gateway.admin.client import ANSWERED_WITH_ERROR, AdminClient, ClientError

# A request admitted just before the drain may run for the default [timeouts].total (600 s);
# the replicas' reports of it then take up to a heartbeat and a converge to arrive.
DEFAULT_WAIT = 630.0
FIRST_POLL, LAST_POLL = 0.1, 1.0  # seconds between looks: quick at first, then once a second
# The least time a look is given (unless the client's own timeout is shorter): the last look
# comes at the deadline, and one given only what is left of the wait (nothing) would time out
# and report the gateway unreachable instead of what keeps the unit busy.
LOOK_AT_LEAST = 1.0
# Admin states in which the unit can still become drained; another means someone undid it.
OUT_OF_SERVICE = ("draining", "drained", "disabled")


def wait_drained(
    client: AdminClient,
    unit_id: str,
    within: float,
    progress: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """The unit's view once drained; ClientError (exit 1) naming what is still in flight when
    `within` seconds pass, or when the unit is put back in service meanwhile."""
    out = progress or sys.stderr
    deadline = clock() + within
    path = f"/admin/units/{quote(unit_id, safe='')}"
    pause, said = FIRST_POLL, ""
    while True:
        look = min(client.timeout, max(LOOK_AT_LEAST, deadline - clock()))
        view = client.get(path, timeout=look)
        if view.get("drained"):
            return dict(view)
        state = view["admin"]["state"]
        if state not in OUT_OF_SERVICE:
            by = view["admin"].get("who") or "someone"
            message = f"{unit_id} was set {state} by {by} while waiting for it to drain"
            raise ClientError(message, ANSWERED_WITH_ERROR)
        busy = still_busy(view)
        left = deadline - clock()
        if left <= 0:
            message = f"{unit_id} not drained after {within:g} s: {busy}"
            raise ClientError(message, ANSWERED_WITH_ERROR)
        if busy != said:  # changes only, not every look
            print(f"waiting for {unit_id} to drain: {busy}", file=out, flush=True)
            said = busy
        sleep(min(pause, left))
        pause = min(LAST_POLL, pause * 2)


def still_busy(view: dict[str, Any]) -> str:
    """What keeps a draining unit from being drained, in words (fleet-wide when it is shared)."""
    fleet = view.get("fleet")
    if fleet is None:
        return f"{view['in_flight']} in flight"
    if "error" in fleet:
        return f"{view['in_flight']} in flight here; {fleet['error']}"
    busy = [
        f"{name}: {r['in_flight']}" for name, r in fleet["replicas"].items() if r["in_flight"] > 0
    ]
    text = f"{fleet['in_flight']} in flight across the fleet"
    if busy:
        text += f" ({', '.join(busy)})"
    if not fleet["current"]:
        text += "; not every replica has applied the drain yet"
    return text
