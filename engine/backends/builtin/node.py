"""`unitgate node --backend builtin`: a leader (engine thread plus the OpenAI server) or a
follower (the step loop plus /health), both on this rank's shard of the model."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.api import Engine
from engine.backends.builtin.served import ServedAs
from engine.backends.builtin.shard import build_then_join
from engine.model.pipeline import PipelineStage
from engine.runtime.follower import run_follower
from engine.runtime.group import destroy_unit_group
from engine.runtime.health import NodeStats, serve_health, stop_health
from engine.runtime.leader import LeaderEngine
from engine.runtime.messages import receive
from engine.runtime.pipelined import PipelinedLeader
from engine.runtime.unicast import Unicast, UnicastReceiver
from engine.scheduler import DEFAULT_PREFILL_CHUNK
from engine.settings import NodeSettings

if TYPE_CHECKING:
    from engine.prefixcache.publisher import KVEventPublisher

log = logging.getLogger(__name__)
KV_EVENTS_TOPIC = "kv"  # as vLLM's examples name it; subscribers take every topic


def run_node(settings: NodeSettings) -> int:
    if settings.is_leader:
        return run_leader(settings)
    return run_follower_node(settings)


def run_leader(settings: NodeSettings) -> int:
    """Serve until SIGTERM/SIGINT; then stop serving first, so no request lands on an engine
    that is broadcasting STOP, and shut the engine down (the followers exit 0)."""
    import uvloop

    from engine.server.run import health_at, serve_until_signal

    engine = start_leader(settings)
    served: Engine = engine
    if settings.served_model_name:
        served = ServedAs(engine, settings.served_model_name)
    try:
        uvloop.run(serve_until_signal(served, settings.host, settings.port, health_at(settings)))
    finally:
        engine.shutdown(timeout=10.0)
    log.info("leader of unit %s stopped", settings.unit)
    return 0


def start_leader(settings: NodeSettings) -> LeaderEngine:
    """Build rank 0's shard, join, start the engine thread; `shutdown()` tears the group down."""
    model, tokenizer, name = build_then_join(settings)
    chunk = settings.prefill_chunk
    options: dict[str, Any] = {
        "model_name": name,
        "unit": settings.unit,
        "prefill_chunk": DEFAULT_PREFILL_CHUNK if chunk is None else chunk,
        "heartbeat_s": settings.collective_timeout / 4,
        "prefix_caching": settings.prefix_caching,
    }
    leave: Callable[[], None] = lambda: _leave(model)  # noqa: E731
    if settings.kv_events is not None:
        publisher = publish_kv_events(settings.kv_events, settings.kv_events_replay)
        options["publish_events"] = publisher.publish

        def leave_and_close() -> None:
            try:
                _leave(model)
            finally:
                publisher.close()

        leave = leave_and_close
    options["teardown"] = leave
    if isinstance(model, PipelineStage):
        unicast = Unicast(settings.world_size, model.sender)
        return PipelinedLeader(model, tokenizer, send_step=unicast, **options).start()
    engine = LeaderEngine(model, tokenizer, **options)
    return engine.start()


def publish_kv_events(endpoint: str, replay: str | None) -> KVEventPublisher:
    """The leader's KV event publisher (pyzmq and msgspec: the engine extra), bound now."""
    from engine.prefixcache.publisher import KVEventPublisher

    publisher = KVEventPublisher(endpoint, replay_endpoint=replay, topic=KV_EVENTS_TOPIC)
    log.info(
        "KV events on %s (replay: %s)", publisher.endpoint, publisher.replay_endpoint or "none"
    )
    print(f"kv_events={publisher.endpoint}", flush=True)
    return publisher


def run_follower_node(settings: NodeSettings) -> int:
    """Serve /health, then mirror the leader's steps until STOP (0) or losing it (1)."""
    model, _, _ = build_then_join(settings)
    stats = NodeStats(
        "follower",
        settings.unit,
        settings.rank,
        model.cache.num_slots,
        progress=lambda: model.layers_run,
    )
    server = serve_health(stats.snapshot, settings.health_host, settings.listener_port)
    print(f"health_port={server.server_port}", flush=True)
    try:
        code = run_follower(model, stats, UnicastReceiver() if settings.pp > 1 else receive)
    finally:
        stop_health(server)
    if code == 0:  # after a lost leader, tearing down could block on the dead peer
        _leave(model)
    return code


def _leave(model: object) -> None:
    """Leave the group; a pipeline stage first lets its last sends (STOP, results) land,
    so a peer is not cut off mid-message (a failed one is the peer's to report)."""
    if isinstance(model, PipelineStage):
        with contextlib.suppress(Exception):
            model.sender.drain()
    destroy_unit_group()
