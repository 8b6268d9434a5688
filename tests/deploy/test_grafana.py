"""deploy/grafana/unitgate.json: well formed, and every panel's PromQL evaluated by a real
Prometheus that has scraped a real gateway.

The live test runs a gateway process in front of simulated units (3 units x 2 nodes), lets a
Prometheus (Debian's) scrape it every 0.5 s, and sends traffic with faults that move each
panel: streamed answers, a 404, a unit answering 500 until its breaker ejects it, a follower
failing its probes until the prober marks the unit unhealthy and then passing again. Then
every panel query goes to /api/v1/query: each must evaluate (status success), every panel
must show data, and the latency percentiles must be numbers.

Grafana expands variables before Prometheus sees a query; here they are substituted the
same way, mechanically (`SUBSTITUTIONS`): the template variables by their "All" value
(`.*`, the dashboard's allValue) and `$__rate_interval` by `1m`, a window that holds the
whole test's traffic (Grafana's own value depends on the panel's width and time range).
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.chaos.clusters import GatewayProcess, start_gateway
from tests.chaos.ops import first_event_after
from tests.deploy.prometheus_server import Prometheus, start_prometheus
from tests.deploy.promql import RULES, exported_series, metric_names
from tests.support import MODEL, ROOT, SimProcess, chat_body, start_sim, stop_process

DASHBOARD = ROOT / "deploy" / "grafana" / "unitgate.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$job": ".*",
    "$instance": ".*",
    "$unit": ".*",
}
GRID_WIDTH = 24
# The panels the issue asks for, by a metric each must use.
REQUIRED = {
    "requests and errors": "unitgate_requests_total",
    "TTFT percentiles per unit": "unitgate_time_to_first_token_seconds_bucket",
    "ITL percentiles per unit": "unitgate_inter_token_latency_seconds_bucket",
    "end-to-end percentiles per unit": "unitgate_request_duration_seconds_bucket",
    "in-flight requests": "unitgate_unit_inflight",
    "queue depth": "unitgate_queue_depth",
    "routable units": "unitgate_unit_routable",
    "per-node probe latency": "unitgate_node_probe_latency_seconds",
    "health transitions": "unitgate_health_transitions_total",
    "breaker transitions": "unitgate_breaker_transitions_total",
    "resumptions": "unitgate_resumptions_total",
    "tokens by model": "unitgate_tokens_total",
}
LATENCY = ("unitgate_time_to_first_token", "unitgate_inter_token", "unitgate_request_duration")


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel but rows, including those inside collapsed rows."""
    out = []
    for panel in doc["panels"]:
        if panel["type"] == "row":
            out += panel.get("panels", [])
        else:
            out.append(panel)
    return out


def expand(expr: str) -> str:
    for name, value in SUBSTITUTIONS.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a variable the test does not substitute: {expr}"
    return expr


def test_the_dashboard_is_well_formed() -> None:
    doc = dashboard()
    assert doc["title"] and doc["uid"]
    assert 36 <= doc["schemaVersion"] <= 41, doc["schemaVersion"]
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    source = variables["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    for name in ("job", "instance", "unit"):
        assert variables[name]["datasource"] == DATASOURCE, name
        assert variables[name]["allValue"] == SUBSTITUTIONS[f"${name}"], name
    inner = [p for row in doc["panels"] for p in row.get("panels", [])]
    ids = [p["id"] for p in doc["panels"] + inner]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
    for panel in panels(doc):
        title = panel.get("title")
        assert title, f"panel {panel['id']} has no title"
        assert panel.get("description"), title
        assert panel["datasource"] == DATASOURCE, title
        grid = panel["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= GRID_WIDTH, title
        targets = panel.get("targets")
        assert targets, f"{title}: no targets"
        refs = [t["refId"] for t in targets]
        assert len(refs) == len(set(refs)), title
        for target in targets:
            assert target["datasource"] == DATASOURCE, title
            assert target.get("expr"), title
            expand(target["expr"])


def test_panels_do_not_overlap() -> None:
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard()["panels"]:
        g = panel["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, (panel["title"], taken[(x, y)])
                taken[(x, y)] = panel["title"]


def test_the_panels_use_only_series_the_gateway_exports() -> None:
    """`up` is Prometheus' own; nothing depends on the recording rules being loaded."""
    exported = exported_series()
    used: set[str] = set()
    for panel in panels(dashboard()):
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names <= exported, (panel["title"], names - exported)
            used |= names
    missing = {what: metric for what, metric in REQUIRED.items() if metric not in used}
    assert missing == {}, f"no panel shows {missing}"


# --- against a real Prometheus ------------------------------------------------------------


@pytest.fixture
def simulator(tmp_path: Path) -> Iterator[SimProcess]:
    sim = start_sim(tmp_path, "--units", "3", "--followers", "1", "--ttft-ms", "5", "--itl-ms", "2")
    try:
        yield sim
    finally:
        stop_process(sim.proc)


@pytest.fixture
def gateway(tmp_path: Path, simulator: SimProcess) -> Iterator[GatewayProcess]:
    gw = start_gateway(tmp_path, simulator, MODEL)
    try:
        yield gw
    finally:
        gw.close()


@pytest.fixture
def prometheus(tmp_path: Path, gateway: GatewayProcess) -> Iterator[Prometheus]:
    """Scraping the gateway every 0.5 s, with the shipped rules (unchanged) loaded too."""
    (tmp_path / "prom").mkdir()
    target = gateway.ops.url.removeprefix("http://")
    prom = start_prometheus(tmp_path / "prom", {"unitgate": [target]}, [RULES], 0.5)
    try:
        yield prom
    finally:
        prom.close()


def until(check: Any, within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within} s")
        time.sleep(0.1)


def post(url: str, body: dict[str, Any]) -> int:
    """One request, its whole answer read; the status."""
    req = urllib.request.Request(url, data=orjson.dumps(body), method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return int(exc.code)


def traffic(gw: GatewayProcess, sim: SimProcess) -> None:
    """Answers, a 404, a breaker ejection (u0 answers 500 six times: the gateway retries
    those elsewhere) and a health flip (u2's follower unhealthy, then fine again)."""
    started = time.time()
    url = gw.public + "/v1/chat/completions"
    sim.fault("u0", "error", status=500, count=6)
    # The breaker trips on u0's fifth 500 in a row. Which unit a request goes to is random
    # (about 1 in 80 batches of 30 sent only 4 to u0), so after 30 requests more go, 10 at a
    # time, until it has tripped; every one is answered (a 500 is retried on another unit).
    statuses = [post(url, chat_body(max_tokens=8)) for _ in range(30)]
    while not first_event_after(gw.ops, "u0", ("breaker ejected",), started):
        assert len(statuses) < 200, f"u0 not ejected by its breaker after {len(statuses)}"
        statuses += [post(url, chat_body(max_tokens=8)) for _ in range(10)]
    assert statuses.count(200) >= len(statuses) - 5, statuses
    assert post(url, chat_body(model="no-such-model")) == 404
    sim.post("/units/u2/nodes/1/health", {"mode": "unhealthy"})
    until(lambda: first_event_after(gw.ops, "u2", ("unhealthy",), started), 10, "u2 unhealthy")
    sim.post("/units/u2/nodes/1/health", {"mode": "ok"})
    until(lambda: first_event_after(gw.ops, "u2", ("healthy",), started), 10, "u2 healthy")


@pytest.mark.slow
def test_every_panel_query_evaluates_against_a_scraped_gateway(
    prometheus: Prometheus, gateway: GatewayProcess, simulator: SimProcess
) -> None:
    prom = prometheus
    # Scrapes begin up to 5 s after Prometheus is ready (its scrape manager's tick); the
    # traffic must come after the first, so rates see it as an increase.
    until(lambda: prom.query('up{job="unitgate"} == 1')["result"], 20, "a first scrape")
    traffic(gateway, simulator)
    after = f'timestamp(up{{job="unitgate"}}) > {time.time():.3f}'
    until(lambda: prom.query(after)["result"], 10, "a scrape after the traffic")
    # The recording rules run on the real series too (evaluated after that scrape).
    routable = "instance:unitgate_units_routable:sum == 3"
    until(lambda: prom.query(routable)["result"], 5, "3 routable units recorded")

    empty = []
    for panel in panels(dashboard()):
        results = {t["refId"]: prom.query(expand(t["expr"]))["result"] for t in panel["targets"]}
        if not any(results.values()):
            empty.append(panel["title"])
        if any(m in t["expr"] for t in panel["targets"] for m in LATENCY):
            values = [float(s["value"][1]) for r in results.values() for s in r]
            assert any(math.isfinite(v) for v in values), (panel["title"], results)
    assert empty == [], f"panels showing no data: {empty}"
    transitions = "sum(increase(unitgate_{}_transitions_total[1m]))"
    for kind in ("health", "breaker"):
        (value,) = prom.query(transitions.format(kind))["result"]
        assert float(value["value"][1]) > 0, kind
