"""The control plane: the gateway's control half, and the workers that serve its port.

It runs what must exist once whatever the number of workers: the probers (probe load does not
grow with workers), the breakers (fed by every worker's evidence, so failures spread over
workers still count toward one trip), the admin API, the events log and its store, and the
operator listener. Its public URL is the workers'. SIGTERM drains every worker, then stops.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from gateway.config import Config
from gateway.heap import freeze_startup
from gateway.observability.fleet import Fleet
from gateway.server import Role, running, write_ready
from gateway.workers.pool import WorkerPool
from gateway.workers.reports import Reports

log = logging.getLogger("unitgate")


async def serve(config: Config, ready_file: Path | None = None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reports, fleet = Reports(), Fleet()
    count = config.gateway.worker_count
    pool = WorkerPool(config, reports, fleet, count)
    role = Role(
        public=False,
        traffic=reports.flowing,
        own=reports.peak,
        workers=pool.view,
        settle=pool.settled,
        by_class=reports.by_class,
        latency=fleet.latency,
        rollout_samples=reports.rollout,
    )
    async with running(config, role=role) as gateway:
        gateway.metrics.fleet = fleet  # /metrics: the workers' request metrics summed in
        gateway.metrics.refresh = pool.refresh
        reports.rollout.units = gateway.units  # the split the workers' windows are summed for
        try:
            await pool.start(gateway)
            gateway.public_url = pool.url
            freeze_startup()
            log.info("%d workers listening on %s", count, pool.url)
            if ready_file is not None:
                write_ready(ready_file, gateway)
            await stop.wait()
            log.info("signal received: draining %d workers", count)
            gateway.draining = True
        finally:
            await pool.stop()
    log.info("gateway stopped")
