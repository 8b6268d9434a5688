"""The probes of the stock kinds: vLLM's /metrics read as load and progress, an OpenAI server's
/v1/models read as liveness; against recorded answers of a real vLLM 0.32 and real sockets."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from gateway.config.unit import UnitConfig
from gateway.health.kinds import node_probes
from gateway.health.kinds.openai import OpenAIProbe, missing_model
from gateway.health.kinds.unitgate import ContractProbe
from gateway.health.kinds.vllm import VllmProbe
from gateway.health.kinds.vllm_metrics import parse_load, wanted_lines
from gateway.health.result import NodeReport
from gateway.health.verdict import GangVerdict
from gateway.upstream.pool import ConnectionPool
from tests.gateway.servers import serve_app

VLLM = Path(__file__).resolve().parents[2] / "data" / "vllm"


def test_a_busy_vllm_metrics_text_reads_as_load_and_steps() -> None:
    load = parse_load((VLLM / "metrics_busy.txt").read_bytes())
    assert load is not None
    assert (load.running, load.waiting) == (4, 0)
    assert load.kv_usage == pytest.approx(0.0221, abs=1e-4)
    assert load.steps == 709  # vllm:iteration_tokens_total_count: engine steps


@pytest.mark.parametrize("name", ["metrics_idle.txt", "multinode_tp3_metrics_idle.txt"])
def test_an_idle_vllm_reads_as_no_load(name: str) -> None:
    load = parse_load((VLLM / name).read_bytes())
    assert load is not None and (load.running, load.waiting) == (0, 0)


def test_only_the_wanted_families_reach_the_parser() -> None:
    text = (VLLM / "metrics_busy.txt").read_bytes()
    kept = wanted_lines(text)
    assert len(kept) < len(text) / 10
    assert "vllm:time_to_first_token_seconds" not in kept


def test_label_sets_are_summed_and_token_counters_stand_in_for_steps() -> None:
    text = b"""# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 2.0
vllm:num_requests_running{engine="1"} 3.0
vllm:num_requests_waiting{engine="0"} 1.0
vllm:prompt_tokens_total{engine="0"} 100.0
vllm:generation_tokens_total{engine="0"} 7.0
"""
    load = parse_load(text)
    assert load is not None and (load.running, load.waiting, load.kv_usage, load.steps) == (
        5,
        1,
        None,
        107,
    )


def test_a_long_prefill_moves_progress_though_no_step_ends() -> None:
    """Measured on vLLM 0.32 with a 7,000-token prompt: between chunks only the KV-cache
    usage moved; the step count and the token counters moved at the first token."""
    text = (VLLM / "metrics_busy.txt").read_text()
    before = parse_load(text.encode())
    chunked = text.replace(
        'vllm:kv_cache_usage_perc{engine="0",model_name="smol"} 0.02209944751381221',
        'vllm:kv_cache_usage_perc{engine="0",model_name="smol"} 0.11',
    )
    after = parse_load(chunked.encode())
    assert before is not None and after is not None and before.steps == after.steps
    assert before.progress != after.progress
    assert parse_load(text.encode()) == before  # the same text, the same fingerprint


def test_the_stall_check_watches_progress_and_names_the_step() -> None:
    verdict = GangVerdict("u0", ["http://h:1"], fall=1, rise=1, stall_timeout=1.0)
    busy = NodeReport(1.0, None, "ok", "u0", "leader", 0, None, 709, 1, 1, progress=1)
    assert verdict.observe([busy], 0.0).problem is None
    moved = NodeReport(1.0, None, "ok", "u0", "leader", 0, None, 709, 1, 1, progress=2)
    assert verdict.observe([moved], 1.5).problem is None  # a prefill chunk: not a stall
    stalled = verdict.observe([moved], 3.0).problem
    assert stalled == "engine stalled: step 709 unchanged for 1.5 s with 1 pending"


def test_a_metrics_text_without_vllms_gauges_is_no_load() -> None:
    assert (
        parse_load(b"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3\n")
        is None
    )


def test_a_models_list_must_show_the_units_model() -> None:
    body = (VLLM / "models.json").read_bytes()
    assert missing_model(body, frozenset({"smol"})) is None
    assert missing_model(body, frozenset({"other"})) == "/v1/models lists ['smol'], not ['other']"
    assert (
        missing_model(b"[]", frozenset({"smol"})) == "/v1/models answered 200 without a `data` list"
    )
    assert missing_model(b"<html>", frozenset({"smol"})) == "/v1/models answered 200 without JSON"


def test_each_kind_probes_its_leader_its_way_and_followers_by_the_contract() -> None:
    followers = ("http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3")
    for kind, probe in (("vllm", VllmProbe), ("openai", OpenAIProbe), ("unitgate", ContractProbe)):
        config = UnitConfig(id="u", leader="http://127.0.0.1:1", nodes=followers, kind=kind)
        probes = node_probes(config, ("m",))
        assert isinstance(probes[0], probe)
        assert all(isinstance(p, ContractProbe) for p in probes[1:])


class StockVllm:
    """A server answering like vLLM's /health and /metrics (the recorded busy text), counting
    its /metrics reads and the heads it was sent."""

    def __init__(self) -> None:
        self.metrics_reads = 0
        self.health_status = 200
        self.metrics_status = 200
        self.auth: list[str | None] = []
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)  # a server without vLLM's /metrics/
        self.app = app

    async def health(self, request: web.Request) -> web.Response:
        self.auth.append(request.headers.get("Authorization"))
        return web.Response(status=self.health_status)

    async def metrics(self, request: web.Request) -> web.Response:
        self.auth.append(request.headers.get("Authorization"))
        self.metrics_reads += 1
        body = (VLLM / "metrics_busy.txt").read_bytes()
        return web.Response(status=self.metrics_status, body=body, content_type="text/plain")


async def test_vllm_probe_reads_metrics_on_its_own_interval() -> None:
    stock = StockVllm()
    async with serve_app(stock.app) as url:
        pool = ConnectionPool(1.0, 30.0, 0)
        try:
            probe = VllmProbe("u0", url, b"Authorization: Bearer k\r\n", interval=3600.0)
            reports = [await probe(pool, 1.0) for _ in range(5)]
            assert stock.metrics_reads == 1  # the first round, then not within the interval
            assert all(r.error is None and r.step == 709 for r in reports)
            assert (reports[0].pending, reports[0].running) == (4, 4)
            assert set(stock.auth) == {"Bearer k"}  # probes carry the unit's key
            verdict = GangVerdict("u0", [url], fall=1, rise=1, stall_timeout=1.0)
            assert verdict.observe([reports[-1]], 0.0).problem is None
            probe.interval = 0.0
            await probe(pool, 1.0)
            assert stock.metrics_reads == 2
            assert probe.metrics is probe.full  # /metrics/ was 404: read in full from then on
        finally:
            pool.close()


async def test_vllm_probe_failure_modes() -> None:
    stock = StockVllm()
    async with serve_app(stock.app) as url:
        pool = ConnectionPool(1.0, 30.0, 0)
        try:
            probe = VllmProbe("u0", url, b"", interval=0.0)
            stock.metrics_status = 500  # no load report, but alive: /health says so
            report = await probe(pool, 1.0)
            assert report.error is None and report.step is None and report.pending is None
            stock.health_status = 503  # vLLM's answer once its engine is dead
            assert (await probe(pool, 1.0)).error == "HTTP 503 from /health"
        finally:
            pool.close()
    refused = await VllmProbe("u0", url, b"", 1.0)(ConnectionPool(0.2, 1.0, 0), 0.2)
    assert refused.error == "connection refused"


async def test_openai_probe_on_models_or_a_health_path() -> None:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "smol"}]})

    async def ping(_: web.Request) -> web.Response:
        return web.Response(status=204)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/ping", ping)
    async with serve_app(app) as url:
        pool = ConnectionPool(1.0, 30.0, 0)
        try:
            ok = node_probes(UnitConfig(id="u", leader=url, kind="openai"), ("smol",))[0]
            report = await ok(pool, 1.0)
            assert (report.error, report.unit, report.rank, report.role) == (None, "u", 0, "leader")
            renamed = UnitConfig(id="u", leader=url, kind="openai", served_model="big")
            wrong = await node_probes(renamed, ("smol",))[0](pool, 1.0)
            assert wrong.error == "/v1/models lists ['smol'], not ['big']"
            pinged = UnitConfig(id="u", leader=url, kind="openai", health_path="/ping")
            not_200 = await node_probes(pinged, ("smol",))[0](pool, 1.0)
            assert not_200.error == "HTTP 204 from /ping"
        finally:
            pool.close()


def test_a_reading_reused_between_metrics_reads_is_not_taken_for_a_stall() -> None:
    """/metrics read every 2 s, probes every 0.25 s, stall_timeout 1.5 s: the rounds between
    reads carry the last reading, marked not fresh, and do not count as standing still."""
    verdict = GangVerdict("u0", ["http://h:1"], fall=1, rise=1, stall_timeout=1.5)
    step = 0
    for tick in range(40):
        now = tick * 0.25
        fresh = tick % 8 == 0
        step += fresh  # the engine moves; the gateway sees it only at each read
        report = NodeReport(
            1.0, None, "ok", "u0", "leader", 0, None, step, 1, 1, progress=step, fresh=fresh
        )
        assert verdict.observe([report], now).problem is None, now
    frozen = NodeReport(1.0, None, "ok", "u0", "leader", 0, None, step, 1, 1, progress=step)
    assert verdict.observe([frozen], 10.0).problem is not None  # a fresh reading, 2 s unchanged
