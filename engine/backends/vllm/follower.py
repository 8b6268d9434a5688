"""A follower node of a vLLM unit: vLLM's headless node, the node's /health, and a watchdog.

This is what `vllm serve --headless` does for nodes other than the head (build the config, start
this node's workers, watch them), plus what a unit node owes its gateway and supervisor: a
/health endpoint, and an exit when the unit is over. vLLM's headless node never exits by itself
when the head goes away, so `LeaderWatch` decides that.

The executor starts on its own thread: joining the unit blocks until the leader's workers come
up (a minute or more on a CPU), and a leader that never comes, a signal, or a dead worker must
still end the node while it waits.
"""

from __future__ import annotations

import logging
import signal
import threading
from argparse import Namespace
from http.server import ThreadingHTTPServer
from typing import Any

from engine.backends.vllm.processes import reap_children
from engine.backends.vllm.serve_args import build_engine_args
from engine.backends.vllm.watchdog import LeaderWatch
from engine.runtime.health import NodeStats, serve_health, stop_health
from engine.settings import NodeSettings

log = logging.getLogger(__name__)
# A vLLM leader opens its rendezvous only after its engine core and workers start: a minute or
# more on a busy CPU, so the builtin engine's --connect-timeout default is too short a wait.
MIN_FIRST_CONTACT_S = 300.0


class FollowerNode:
    def __init__(self, settings: NodeSettings, args: Namespace) -> None:
        self.settings, self.args = settings, args
        self.stats = NodeStats("follower", settings.unit, settings.rank, settings.num_slots)
        self.executor: Any = None
        self.server: ThreadingHTTPServer | None = None
        self._done = threading.Event()
        self._code = 0
        self._lock = threading.Lock()

    def finish(self, code: int, why: str) -> None:
        """First caller wins: its exit code and reason are the node's."""
        with self._lock:
            if self._done.is_set():
                return
            self._code = code
            self._done.set()
        report = log.info if code == 0 else log.error
        report("follower of unit %s stopping: %s", self.settings.unit, why)
        if code:
            self.stats.mark_unhealthy(why)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _: self.finish(0, signal.Signals(signum).name))
        host, port = self.settings.master_addr
        watch = LeaderWatch(
            host,
            port,
            first_contact_within=max(self.settings.connect_timeout, MIN_FIRST_CONTACT_S),
            lost_after=self.settings.leader_lost_after,
            on_lost=lambda why: self.finish(1, why),
        ).start()
        threading.Thread(target=self._join_unit, name="vllm-headless", daemon=True).start()
        try:
            while not self._done.wait(1.0):  # a timed wait keeps signals deliverable
                pass
        finally:
            watch.stop()
            if self.server is not None:
                stop_health(self.server)
            self._stop_executor()
        return self._code

    def _join_unit(self) -> None:
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor

        try:
            config = build_engine_args(self.args).create_engine_config(
                usage_context=UsageContext.OPENAI_API_SERVER, headless=True
            )
            executor = MultiprocExecutor(config, monitor_workers=False)
        except Exception as exc:
            self.finish(1, f"joining the unit failed: {exc!r}")
            return
        self.executor = executor
        executor.register_failure_callback(lambda: self.finish(1, "a vLLM worker died"))
        executor.start_worker_monitor()
        # Like the builtin follower: /health answers (and the port is announced) once joined.
        settings = self.settings
        self.server = serve_health(
            self.stats.snapshot, settings.health_host, settings.listener_port
        )
        print(f"health_port={self.server.server_port}", flush=True)
        log.info("follower of unit %s joined (rank %d)", self.settings.unit, self.settings.rank)

    def _stop_executor(self) -> None:
        """Workers first, directly: with the leader gone they sit in a collective or a spin
        wait that vLLM's own shutdown waits out for ~10 s, longer than a supervisor's grace
        before it SIGKILLs this node (which would orphan them). Then the executor's queues."""
        reap_children(grace=2.0)
        if self.executor is not None:
            self.executor.shutdown()


def run_follower(settings: NodeSettings, args: Namespace) -> int:
    """`args`: this node's `vllm serve` arguments (see serve_args); the server's are unused."""
    return FollowerNode(settings, args).run()
