"""The two ways a vLLM unit can wedge where vLLM itself would wait, and the threads that notice.

- Leader: a follower died mid-step. The leader's workers then wait on a peer that will never
  answer; vLLM gives up only after its execute timeout. `StallWatch` declares the unit failed
  once work is pending and no iteration has completed for `stall_after` seconds, or as soon as
  the engine reports itself unhealthy (vLLM's engine core died).
- Follower: the leader went away. A headless vLLM node keeps its workers waiting for the next
  step forever. `LeaderWatch` checks the leader's rendezvous port (the torch.distributed store
  vLLM's rank 0 keeps open for the unit's lifetime) and gives up once it has been closed for
  `lost_after` seconds.

Both only call back; what to do (fail requests, exit) is the node's decision.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
POLL_S = 0.5


class StallWatch:
    def __init__(
        self,
        snapshot: Callable[[], dict[str, Any]],
        stall_after: float,
        on_stall: Callable[[str], None],
    ) -> None:
        self._snapshot, self._stall_after, self._on_stall = snapshot, stall_after, on_stall
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)

    def start(self) -> StallWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        last_step, since = -1, time.monotonic()
        while not self._stop.wait(POLL_S):
            body = self._snapshot()
            now = time.monotonic()
            if body["status"] != "ok":  # e.g. vLLM's engine core died: nothing left to wait for
                self._on_stall(str(body.get("reason", body["status"])))
                return
            if body["step"] != last_step or not body["pending"]:
                last_step, since = body["step"], now
                continue
            if now - since > self._stall_after:
                reason = f"no engine step for {now - since:.1f} s with {body['pending']} pending"
                self._on_stall(reason)
                return


class LeaderWatch:
    def __init__(
        self,
        host: str,
        port: int,
        first_contact_within: float,
        lost_after: float,
        on_lost: Callable[[str], None],
    ) -> None:
        self._address = (host, port)
        self._first, self._lost_after, self._on_lost = first_contact_within, lost_after, on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-watch", daemon=True)

    def start(self) -> LeaderWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        started = time.monotonic()
        seen: float | None = None  # last time the port answered
        while not self._stop.wait(POLL_S):
            now = time.monotonic()
            if self._reachable():
                seen = now
                continue
            if seen is None and now - started > self._first:
                self._on_lost(f"leader {self._target} not reachable within {self._first:g} s")
                return
            if seen is not None and now - seen > self._lost_after:
                self._on_lost(f"leader {self._target} gone for {now - seen:.1f} s")
                return

    @property
    def _target(self) -> str:
        return f"{self._address[0]}:{self._address[1]}"

    def _reachable(self) -> bool:
        try:
            with socket.create_connection(self._address, timeout=1.0):
                return True
        except OSError:
            return False
