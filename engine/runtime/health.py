"""Node health: counters the compute thread writes, and an HTTP endpoint that reads them
(/health as JSON, /metrics as Prometheus text).

The endpoint runs on its own daemon thread (stdlib ThreadingHTTPServer) so it answers while the
node is inside a long forward pass or blocked in a collective: a prober can then tell "busy"
(step advancing) from "stuck" (last_step_age_s growing with work pending). A leader serves it
too, so its answers do not queue behind the API's stream writes on the event loop.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from engine.prefixcache import PrefixCacheStats
from engine.runtime import node_metrics

log = logging.getLogger(__name__)

Snapshot = Callable[[], Mapping[str, Any]]


class NodeStats:
    """One writer (the compute thread), many readers (health handlers), one lock."""

    def __init__(
        self,
        role: str,
        unit: str,
        rank: int,
        kv_slots_total: int,
        tied: bool = False,
        progress: Callable[[], int] | None = None,
    ) -> None:
        """`tied`: the leader answers a tied request's head once it starts (the server's
        `x-unitgate-tied`), and says so as `tied_requests` for the gateway to rely on.
        `progress`: a count that moves while the engine computes, inside a step too (the
        builtin model's layers run), reported as `progress`: the gateway's stall rule watches
        it instead of `step`, so one slow step is not a hung collective."""
        self._lock = threading.Lock()
        self._fixed: dict[str, Any] = {
            "role": role,
            "unit": unit,
            "rank": rank,
            "pid": os.getpid(),
        }
        if tied:
            self._fixed["tied_requests"] = True
        self._kv_total = kv_slots_total
        self._progress = progress
        self._step = 0
        self._pending = 0
        self._slots_used = 0
        self._last_step: float | None = None
        self._failure: str | None = None
        self._cache: PrefixCacheStats | None = None  # the leader's; followers have none
        self._kv_usage = 0.0

    def record_step(self, pending: int, slots_used: int) -> None:
        with self._lock:
            self._step += 1
            self._last_step = time.monotonic()
            self._pending, self._slots_used = pending, slots_used

    def set_load(self, pending: int, slots_used: int) -> None:
        with self._lock:
            self._pending, self._slots_used = pending, slots_used

    def set_cache(self, stats: PrefixCacheStats, usage: float) -> None:
        """The prefix cache's counters and the share of KV blocks in use (the leader's)."""
        with self._lock:
            self._cache, self._kv_usage = stats, usage

    def mark_unhealthy(self, reason: str) -> bool:
        """True the first time only, so the caller logs the change once."""
        with self._lock:
            if self._failure is not None:
                return False
            self._failure = reason
            return True

    @property
    def failure(self) -> str | None:
        with self._lock:
            return self._failure

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            age = None if self._last_step is None else time.monotonic() - self._last_step
            body: dict[str, Any] = {
                "status": "ok" if self._failure is None else "unhealthy",
                **self._fixed,
                "step": self._step,
                "pending": self._pending,
                "last_step_age_s": None if age is None else round(age, 3),
                "kv_slots_used": self._slots_used,
                "kv_slots_total": self._kv_total,
            }
            if self._progress is not None:
                body["progress"] = self._progress()
            cache = self._cache
            if cache is not None:
                body["kv_cache_usage"] = round(self._kv_usage, 4)
                body["prefix_cache_queries"] = cache.queries
                body["prefix_cache_hits"] = cache.hits
            if self._failure is not None:
                body["reason"] = self._failure
            return body


def _handler(snapshot: Snapshot) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path not in ("/health", "/metrics"):
                self.send_error(404)
                return
            body = read_report(snapshot)
            if path == "/metrics":
                self._send(200, node_metrics.CONTENT_TYPE, node_metrics.render(body).encode())
                return
            self._send(
                200 if body.get("status") == "ok" else 503,
                "application/json",
                json.dumps(body).encode(),
            )

        def _send(self, status: int, content_type: str, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Probes arrive every few seconds; steady state is not logged."""

    return Handler


def read_report(snapshot: Snapshot) -> dict[str, Any]:
    """A snapshot that raises is an unhealthy node, not a dropped connection (which a prober
    would count as a dead node and report with a less useful reason)."""
    try:
        return dict(snapshot())
    except Exception as exc:
        return {"status": "error", "error": repr(exc)}


def serve_health(snapshot: Snapshot, host: str, port: int) -> ThreadingHTTPServer:
    """Start /health on a daemon thread; port 0 picks a free port (see server.server_port).
    Stop it with `stop_health`."""
    server = ThreadingHTTPServer((host, port), _handler(snapshot))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="health-http", daemon=True)
    thread.start()
    log.info("health endpoint on http://%s:%d/health", host, server.server_port)
    return server


def stop_health(server: ThreadingHTTPServer) -> None:
    """Stop answering and release the port (shutdown() alone leaves the socket bound)."""
    server.shutdown()
    server.server_close()
