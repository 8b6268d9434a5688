"""/metrics as a scraper reads it, from a real gateway in front of the sim: which answers the
first-token histogram counts, the model label, tokens by model, buckets reaching
`[timeouts].total`, build and process metrics, and the text and OpenMetrics formats (the text
checked by Prometheus' own `promtool check metrics`)."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.parser import text_string_to_metric_families as text_families

from gateway.server import Gateway, running
from gateway.version import version
from tests.deploy.promql import tool
from tests.support import MODEL, SimProcess, chat_body, gateway_config

CHAT = "/v1/chat/completions"
TTFT = "unitgate_time_to_first_token_seconds"
DURATION = "unitgate_request_duration_seconds"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@pytest.fixture
async def gateway(clean_sim: SimProcess) -> AsyncIterator[Gateway]:
    async with running(gateway_config(clean_sim.units, timeouts={"total": 900.0})) as gw:
        yield gw


def total(gw: Gateway, sample: str, **labels: str) -> float:
    """A sample's value summed over the series whose labels include `labels`."""
    return sum(
        s.value
        for family in gw.metrics.registry.collect()
        for s in family.samples
        if s.name == sample and labels.items() <= s.labels.items()
    )


async def post(http: aiohttp.ClientSession, gw: Gateway, body: dict[str, object]) -> int:
    async with http.post(gw.public_url + CHAT, json=body) as resp:
        await resp.read()
        return resp.status


async def scrape(http: aiohttp.ClientSession, gw: Gateway, accept: str | None) -> tuple[str, str]:
    headers = {} if accept is None else {"Accept": accept}
    async with http.get(gw.metrics_url + "/metrics", headers=headers) as resp:
        assert resp.status == 200
        return resp.headers["Content-Type"], await resp.text()


async def test_first_token_latency_counts_streamed_answers_only(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    assert await post(http, gateway, chat_body(stream=True)) == 200
    assert total(gateway, TTFT + "_count", model=MODEL) == 1
    assert await post(http, gateway, chat_body(stream=False)) == 200
    assert await post(http, gateway, {**chat_body(), "model": "nope"}) == 404
    assert await post(http, gateway, {**chat_body(), "model": 1}) == 400  # the gateway's own
    assert total(gateway, TTFT + "_count") == 1  # none of those three
    assert total(gateway, DURATION + "_count", model=MODEL) == 2  # both answers
    assert total(gateway, "unitgate_requests_total", unit="none", model="none") == 2


async def test_a_units_4xx_to_a_stream_is_no_first_token(
    gateway: Gateway, http: aiohttp.ClientSession, clean_sim: SimProcess
) -> None:
    for unit in clean_sim.units:
        clean_sim.fault(unit["id"], "error", status=400, count=1)
    assert await post(http, gateway, chat_body(stream=True)) == 400
    assert total(gateway, "unitgate_requests_total", model=MODEL, status="400") == 1
    assert total(gateway, TTFT + "_count") == 0


async def test_tokens_are_counted_by_model(gateway: Gateway, http: aiohttp.ClientSession) -> None:
    assert await post(http, gateway, chat_body(stream=False)) == 200
    assert total(gateway, "unitgate_tokens_total", model=MODEL, type="completion") == 8
    assert total(gateway, "unitgate_tokens_total", model=MODEL, type="prompt") > 0


async def test_latency_buckets_reach_the_total_timeout(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    assert await post(http, gateway, chat_body(stream=True)) == 200
    _, text = await scrape(http, gateway, None)
    bounds = [
        line.split('le="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith(DURATION + "_bucket")
    ]
    # `[timeouts].total` = 900 s, and a bound past it for requests cut at the deadline.
    assert bounds[-4:] == ["600.0", "900.0", "1200.0", "+Inf"]


async def test_build_and_process_metrics(gateway: Gateway, http: aiohttp.ClientSession) -> None:
    _, text = await scrape(http, gateway, None)
    families = {f.name: f for f in text_families(text)}
    (build,) = families["unitgate_build_info"].samples
    assert build.value == 1 and build.labels["version"] == version()
    for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_max_fds"):
        assert families[name].samples[0].value > 0, name
    assert families["process_open_fds"].samples[0].value >= 3  # at least both listeners


async def test_the_text_format_by_default_and_promtool_accepts_it(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    assert await post(http, gateway, chat_body(stream=True)) == 200
    content_type, text = await scrape(http, gateway, None)
    assert content_type.startswith("text/plain; version=0.0.4")
    assert "# EOF" not in text and f'model="{MODEL}"' in text
    done = subprocess.run(
        [tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


async def test_openmetrics_when_the_scraper_asks_for_it(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    assert await post(http, gateway, chat_body(stream=True)) == 200
    content_type, text = await scrape(http, gateway, OPENMETRICS)
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in text_string_to_metric_families(text)}  # strict parser
    assert families["unitgate_build"].type == "info"
    (count,) = [s for s in families[TTFT].samples if s.name == TTFT + "_count"]
    assert count.value == 1 and count.labels["model"] == MODEL
