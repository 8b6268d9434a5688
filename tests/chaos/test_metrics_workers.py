"""/metrics of `[gateway].workers = 2` (a control plane and two worker processes): each
process's own CPU, memory and file descriptors apart (the workers' with a `worker` label),
the request metrics summed with their model label, build info once, and both formats."""

from __future__ import annotations

import subprocess
import urllib.request

import orjson
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.chaos.clusters import GatewayProcess
from tests.chaos.ops import samples, until
from tests.deploy.promql import tool
from tests.support import MODEL, chat_body

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(120)]


@pytest.fixture
def gateway(two_workers: GatewayProcess) -> GatewayProcess:
    return two_workers


def chat(gw: GatewayProcess, stream: bool) -> None:
    req = urllib.request.Request(
        gw.public + "/v1/chat/completions", data=orjson.dumps(chat_body(stream))
    )
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


def scrape(gw: GatewayProcess, accept: str | None = None) -> str:
    req = urllib.request.Request(gw.ops.url + "/metrics")
    if accept is not None:
        req.add_header("Accept", accept)
    with urllib.request.urlopen(req, timeout=5) as resp:
        return bytes(resp.read()).decode()


def both_workers(gw: GatewayProcess) -> str | None:
    text = scrape(gw)
    cpu = samples(text, "process_cpu_seconds_total")
    return text if {"", '{worker="0"}', '{worker="1"}'} <= set(cpu) else None


async def test_each_process_is_shown_apart_and_requests_summed_by_model(
    gateway: GatewayProcess,
) -> None:
    for stream in (True, False, True):
        chat(gateway, stream)
    text = await until(lambda: both_workers(gateway), 10.0, "both workers' process metrics")
    for name in ("process_resident_memory_bytes", "process_open_fds", "process_max_fds"):
        assert set(samples(text, name)) == {"", '{worker="0"}', '{worker="1"}'}, name
    assert len(samples(text, "unitgate_build_info")) == 1
    ttft = samples(text, "unitgate_time_to_first_token_seconds_count")
    assert sum(ttft.values()) == 2 and all(f'model="{MODEL}"' in k for k in ttft)
    done = subprocess.run(
        [tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
    om = scrape(gateway, "application/openmetrics-text; version=1.0.0")
    families = {f.name: f for f in text_string_to_metric_families(om)}  # strict parser
    workers = {s.labels.get("worker") for s in families["process_cpu_seconds"].samples}
    assert workers == {None, "0", "1"}


def tenants_and_fairness(gw: GatewayProcess, sent: int) -> str | None:
    text = scrape(gw)
    requests = samples(text, "unitgate_tenant_requests_total")
    fairness = samples(text, "unitgate_class_fairness")
    return text if sum(requests.values()) == sent and fairness else None


async def test_tenants_are_summed_and_fairness_covers_every_workers_window(
    gateway: GatewayProcess,
) -> None:
    for n in range(12):
        chat(gateway, n % 2 == 0)
    text = await until(lambda: tenants_and_fairness(gateway, 12), 10.0, "the tenants' requests")
    tenants = {
        k.split('tenant="')[1].split('"')[0]
        for k in samples(text, "unitgate_tenant_requests_total")
    }
    assert tenants <= {"anonymous", "other"}, tenants  # each worker labels its own heavy hitters
    assert samples(text, "unitgate_class_fairness") == {'{class="standard"}': 1.0}
    assert '{class="standard"}' in samples(text, "unitgate_class_queue_depth")
