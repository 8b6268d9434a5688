"""The gateway process's own metrics: which build runs, and what the process uses.

`unitgate_build_info` is 1, with the version and the Python in its labels. `process_*` are
the families of prometheus_client's ProcessCollector, by the same names, read the same way
from /proc at scrape time (so Linux only; elsewhere absent), with one change: the open file
descriptors are counted from the size of /proc/self/fd, which Linux (6.2 and later) reports as
their number, instead of by listing the directory as ProcessCollector does. The listing costs
about 3 us a descriptor, 15 ms at 5,000 connections, and a worker collects its metrics on its
event loop every second (fleet.py); an older kernel, which reports 0, is listed.

In a control plane each worker's own `process_*` come in beside its own, labelled with the
worker's index (fleet.py).
"""

from __future__ import annotations

import os
import platform
import resource
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.version import version

PROC = "/proc/self"


def register(registry: CollectorRegistry) -> None:
    """Build info and the process metrics, on the gateway's registry."""
    doc = "The running unitgate: its version and Python."
    labels = {"version": version(), "python": platform.python_version()}
    Info("unitgate_build", doc, registry=registry).info(labels)
    if os.path.isdir(PROC):
        registry.register(ProcessMetrics())


def open_fds(path: str = PROC + "/fd") -> int:
    """The process's open file descriptors, without listing them where Linux can say."""
    counted = os.stat(path).st_size
    return counted if counted > 0 else len(os.listdir(path))


class ProcessMetrics(Collector):
    def __init__(self) -> None:
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.page = resource.getpagesize()
        # /proc/self/stat says when the process started in ticks since boot; /proc/stat when
        # the machine booted.
        with open("/proc/stat", "rb") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith(b"btime "))
        self.start_time = boot + float(_stat()[19]) / self.ticks

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stat = _stat()
        yield GaugeMetricFamily(
            "process_virtual_memory_bytes", "Virtual memory size in bytes.", float(stat[20])
        )
        yield GaugeMetricFamily(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            float(stat[21]) * self.page,
        )
        yield GaugeMetricFamily(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            self.start_time,
        )
        yield CounterMetricFamily(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            (float(stat[11]) + float(stat[12])) / self.ticks,
        )
        yield GaugeMetricFamily(
            "process_open_fds", "Number of open file descriptors.", float(open_fds())
        )
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        yield GaugeMetricFamily(
            "process_max_fds", "Maximum number of open file descriptors.", float(soft)
        )


def _stat() -> list[bytes]:
    """/proc/self/stat's fields after the command name (field 3 on, from index 0)."""
    with open(PROC + "/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()
