"""The leader's /health on a listener of its own, answered from a thread.

The API's event loop writes every token of every stream; when the leader is saturated a
/health request waits its turn behind those writes and misses the gateway's probe timeout
although the node is fine (`python -m loadtest.bench.leader_health` measures it). The
followers' threaded server answers whatever the loop is doing, so the leader runs one too when
it is given a health port. The API port keeps answering /health, for callers that probe it.
"""

from __future__ import annotations

from dataclasses import dataclass
from http.server import ThreadingHTTPServer

from engine.runtime.health import Snapshot, serve_health, stop_health


@dataclass(frozen=True, slots=True)
class HealthAt:
    host: str
    port: int  # 0 picks a free one


class LeaderHealth:
    """Owns the thread listener: started once the API listens, stopped before the API stops.

    Started after the API binds, a passing probe also means the API accepts requests; stopped
    first, probes fail as soon as the leader begins to stop, so the gateway ejects the unit
    instead of sending new requests to a closing API port.
    """

    def __init__(self, snapshot: Snapshot, at: HealthAt | None) -> None:
        self._snapshot, self._at = snapshot, at
        self._server: ThreadingHTTPServer | None = None

    def start(self, api_port: int) -> None:
        """Announce both ports, `health_port=` last: what starters wait for, like a follower's
        line; without a listener of its own it is the API port, as before there was one."""
        health_port = api_port
        if self._at is not None and self._server is None:
            self._server = serve_health(self._snapshot, self._at.host, self._at.port)
            health_port = self._server.server_port
        print(f"api_port={api_port}", flush=True)
        print(f"health_port={health_port}", flush=True)

    def stop(self) -> None:
        """Blocks up to the server's poll interval (0.5 s): call it off the event loop."""
        server, self._server = self._server, None
        if server is not None:
            stop_health(server)
