"""deploy/prometheus's alerts end to end: a real Prometheus (Debian's) scrapes a gateway in
front of real builtin-engine units (`unitgate up`: 2 units x 2 nodes, TP=2, the tiny model)
and evaluates the shipped rules.

- A follower is killed with SIGKILL. The unit-down alert (UnitgateUnitOutOfRouting) must be
  firing in /api/v1/alerts within its `for:` plus two scrape intervals of the gateway taking
  the unit out, and must be gone within two intervals of the gateway taking it back, once
  `unitgate up` has restarted the unit as a whole.
- A second target of the job where nothing listens: UnitgateGatewayDown fires for it within
  its `for:` plus two intervals of its first scrape, and never for the live gateway.

The one change to the rules is mechanical: every `for:` is divided by 60 (1m -> 1 s), since
`unitgate up` restarts a unit here within about 6 s and a production `for: 1m` would outlast
the outage. Expressions, windows and thresholds are the shipped ones. Prometheus scrapes and
evaluates every 0.5 s.

Why "within `for:` + 2 intervals" holds: the gateway's flip is in the next scrape (at most
one interval later), the next evaluation sees that sample (at most one more), and the alert
fires exactly `for:` after that evaluation (the `for:` is a multiple of the interval). SLACK
covers what is left: the scrape's own duration, this test's 0.1 s poll and the API call.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from gateway.base.ports import free_ports
from tests.chaos.clusters import RealCluster, start_real
from tests.chaos.ops import first_event_after
from tests.deploy.prometheus_server import Prometheus, shorten_for, start_prometheus
from tests.deploy.promql import RULES, tool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

INTERVAL = 0.5  # scrape and evaluation interval, seconds
FACTOR = 60  # every `for:` divided by this
SLACK = 0.3
POLL = 0.1
UNIT_DOWN = "UnitgateUnitOutOfRouting"
GATEWAY_DOWN = "UnitgateGatewayDown"
# What may fire here besides the two alerts under test: the killed unit's nodes (the killed
# follower, and the leader while `unitgate up` restarts the gang) fail their probes.
ALSO_EXPECTED = {"UnitgateNodeProbesFailing"}

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], within: float, what: str) -> tuple[T, float]:
    """Polls `check` every POLL seconds until it returns something truthy; that and the wall
    time it was seen, or a failure at the deadline. A connection error counts as not yet (a
    restarting node refuses its /health)."""
    deadline = time.monotonic() + within
    last: OSError | None = None
    while True:
        try:
            result = check()
        except OSError as exc:
            result, last = None, exc
        if result:
            return result, time.time()
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within} s (last error: {last!r})")
        time.sleep(POLL)


def firing_names(prom: Prometheus, seen: set[tuple[str, str]]) -> None:
    """Adds every firing alert (name, unit or instance) to `seen`."""
    for alert in prom.alerts():
        if alert["state"] == "firing":
            labels = alert["labels"]
            seen.add((labels["alertname"], labels.get("unit") or labels.get("instance", "")))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RealCluster]:
    (tmp_path / "up").mkdir()
    up = start_real(tmp_path / "up")
    try:
        yield up
    finally:
        up.close()


def test_unit_down_fires_and_resolves_gateway_down_fires(
    tmp_path: Path, cluster: RealCluster
) -> None:
    text, holds = shorten_for(RULES.read_text(), FACTOR)
    rules = tmp_path / "rules.yml"
    rules.write_text(text)
    checked = subprocess.run(
        [tool("promtool"), "check", "rules", str(rules)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    live = cluster.ops.url.removeprefix("http://")
    dead = f"127.0.0.1:{free_ports(1)[0]}"
    (tmp_path / "prom").mkdir()
    prom = start_prometheus(tmp_path / "prom", {"unitgate": [live, dead]}, [rules], INTERVAL)
    seen: set[tuple[str, str]] = set()
    try:
        # Prometheus starts scraping up to 5 s after it is ready (its scrape manager applies
        # targets on a 5 s tick), so this is timed from the dead target's first scrape.
        _, down_at = wait_for(lambda: prom.firing(GATEWAY_DOWN, instance=dead), 20, GATEWAY_DOWN)
        (series,) = prom.query(f'up{{instance="{dead}"}}[5m]')["result"]
        first_scrape = float(series["values"][0][0])
        down_bound = holds[GATEWAY_DOWN] + 2 * INTERVAL + SLACK
        assert down_at - first_scrape <= down_bound, (down_at - first_scrape, down_bound)
        up = prom.query(f'up{{instance="{live}"}}')["result"]
        assert [s["value"][1] for s in up] == ["1"], up
        firing_names(prom, seen)
        assert seen == {(GATEWAY_DOWN, dead)}, f"firing before any fault: {seen}"

        pid = cluster.node_pid("u0", 1)
        killed = time.time()
        os.kill(pid, signal.SIGKILL)

        def unit_down() -> object:
            firing_names(prom, seen)
            return prom.firing(UNIT_DOWN, unit="u0")

        (alert, *_), fired_at = wait_for(unit_down, 30, f"{UNIT_DOWN} for u0")
        out = first_event_after(cluster.ops, "u0", ("unhealthy", "ejected"), killed)
        assert out is not None, "the gateway never took u0 out"
        hold = holds[UNIT_DOWN]
        bound = hold + 2 * INTERVAL + SLACK
        assert fired_at - out["time"] <= bound, (fired_at - out["time"], bound, alert)

        wait_for(lambda: cluster.ready() or None, 90, "u0 routable again")
        back = first_event_after(cluster.ops, "u0", ("healthy",), killed)
        assert back is not None, "no healthy event for u0 after its restart"
        assert fired_at < back["time"], "the alert fired only after the unit was back"

        def resolved() -> bool:
            firing_names(prom, seen)
            return not [a for a in prom.alerts() if a["labels"].get("alertname") == UNIT_DOWN]

        _, gone_at = wait_for(resolved, 10, f"{UNIT_DOWN} resolved")
        assert gone_at - back["time"] <= 2 * INTERVAL + SLACK, gone_at - back["time"]
        firing_names(prom, seen)
        assert not prom.firing(GATEWAY_DOWN, instance=live)
        unexpected = {
            (name, who)
            for name, who in seen
            if (name, who) not in {(GATEWAY_DOWN, dead), (UNIT_DOWN, "u0")}
            and not (name in ALSO_EXPECTED and who == "u0")
        }
        assert unexpected == set(), unexpected
        print(
            f"\nprometheus e2e ({INTERVAL} s scrape and evaluation, for: {hold:g} s):"
            f" gateway down fired {down_at - first_scrape:.2f} s after the dead target's first"
            f" scrape (bound {down_bound:.2f} s);"
            f" kill -> u0 out of routing {out['time'] - killed:.2f} s;"
            f" out -> {UNIT_DOWN} firing {fired_at - out['time']:.2f} s"
            f" (bound {bound:.2f} s); kill -> firing {fired_at - killed:.2f} s;"
            f" u0 back {back['time'] - killed:.2f} s after the kill;"
            f" back -> resolved {gone_at - back['time']:.2f} s; firing seen: {sorted(seen)}"
        )
    finally:
        prom.close()
