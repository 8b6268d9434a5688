"""The workers' counters and histograms summed into the control plane's /metrics, and their
process metrics shown per worker."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gateway.observability.fleet import Fleet, samples
from gateway.observability.histogram import HistogramFamily


def worker_registry(requests: int, ttft: list[float]) -> CollectorRegistry:
    r = CollectorRegistry()
    counter = Counter("unitgate_requests", "Requests.", ["unit", "status"], registry=r)
    counter.labels("u0", "200").inc(requests)
    family = HistogramFamily("unitgate_time_to_first_token_seconds", "TTFT.", "unit")
    for value in ttft:
        family.labels("u0").observe(value)
    r.register(family)
    return r


def rendered(fleet: Fleet, own: CollectorRegistry) -> str:
    return generate_latest(fleet.merged(own)).decode()


def line(text: str, prefix: str) -> float:
    (match,) = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    return float(match.rsplit(" ", 1)[1])


def test_workers_sum_into_the_control_planes_families() -> None:
    own = CollectorRegistry()
    Counter("unitgate_requests", "Requests.", ["unit", "status"], registry=own)  # never counts
    fleet = Fleet()
    fleet.update(0, samples(worker_registry(3, [0.01, 0.2])))
    fleet.update(1, samples(worker_registry(4, [0.05])))
    text = rendered(fleet, own)
    assert line(text, 'unitgate_requests_total{status="200",unit="u0"}') == 7
    assert line(text, 'unitgate_time_to_first_token_seconds_count{unit="u0"}') == 3
    assert text.count("# TYPE unitgate_requests_total counter") == 1  # one family, merged
    assert "_created" not in text


def test_a_restarted_worker_never_takes_a_counter_backwards() -> None:
    own, fleet = CollectorRegistry(), Fleet()
    fleet.update(0, samples(worker_registry(10, [0.1])))
    before = line(rendered(fleet, own), 'unitgate_requests_total{status="200",unit="u0"}')
    fleet.retire(0)  # it exited; its new process counts from zero
    fleet.update(0, samples(worker_registry(2, [])))
    after = line(rendered(fleet, own), 'unitgate_requests_total{status="200",unit="u0"}')
    assert (before, after) == (10, 12)


def test_gauges_are_not_summed() -> None:
    from prometheus_client import Gauge

    r = CollectorRegistry()
    Gauge("unitgate_queue_depth", "Waiting.", registry=r).set(5)
    assert samples(r) == []


class _Process(Collector):
    """What ProcessCollector yields, with chosen values."""

    def __init__(self, cpu: float) -> None:
        self.cpu = cpu

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("process_cpu_seconds", "CPU.", value=self.cpu)
        yield GaugeMetricFamily("process_open_fds", "Fds.", value=10 * self.cpu)


def process_registry(cpu: float) -> CollectorRegistry:
    r = CollectorRegistry()
    r.register(_Process(cpu))
    return r


def test_each_workers_process_metrics_are_shown_apart_never_summed() -> None:
    own, fleet = process_registry(1.0), Fleet()
    fleet.update(0, samples(process_registry(2.0)))
    fleet.update(1, samples(process_registry(3.0)))
    text = rendered(fleet, own)
    assert line(text, "process_cpu_seconds_total ") == 1  # the control plane's own
    assert line(text, 'process_cpu_seconds_total{worker="0"}') == 2
    assert line(text, 'process_open_fds{worker="1"}') == 30
    assert text.count("# TYPE process_open_fds gauge") == 1
    fleet.retire(1)  # an exited worker's process is gone, not folded into a total
    text = rendered(fleet, own)
    assert 'worker="1"' not in text and line(text, 'process_cpu_seconds_total{worker="0"}') == 2


def test_the_workers_fairness_windows_are_kept_apart_and_dropped_on_exit() -> None:
    fleet = Fleet()
    fleet.update_shares(0, {"batch": {"a": 10}})
    fleet.update_shares(1, {"batch": {"a": 5, "b": 15}})
    assert fleet.shares() == [{"batch": {"a": 10.0}}, {"batch": {"a": 5.0, "b": 15.0}}]
    fleet.retire(0)  # a window, not a count: nothing of it is kept
    assert fleet.shares() == [{"batch": {"a": 5.0, "b": 15.0}}]
