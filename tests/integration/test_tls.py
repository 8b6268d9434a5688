"""TLS end to end, with certificates the tests make (tests/tls_support.py): the gateway's two
listeners serving HTTPS, and an https unit that demands a client certificate (mutual TLS),
reached by the request path and by its probes with the unit's own CA and certificate."""

from __future__ import annotations

import contextlib
import logging
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.base.readyfile import wait_ready_blocking
from gateway.config import ConfigError, config_from_dict
from gateway.server import running
from tests.gateway.servers import until
from tests.support import MODEL, ROOT, chat_body, sse_events, stop_process, until_routable
from tests.tls_support import Certs, make_certs

pytestmark = pytest.mark.both_relays

HEALTH = {"enabled": True, "interval": 0.05, "timeout": 0.5, "fall": 1, "rise": 1}
WORDS = ["Hello", " over", " TLS"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """Another CA, which never signed the unit's certificate."""
    return make_certs(tmp_path_factory.mktemp("tls-other"), "stranger")


class TlsUnit:
    """A minimal OpenAI server behind HTTPS that admits only clients with a certificate its CA
    signed; it records the client certificate's subject of every request."""

    def __init__(self) -> None:
        self.peers: list[Any] = []
        self.canaries = 0
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.canary)
        self.app = app

    async def models(self, request: web.Request) -> web.Response:
        self.peers.append(request.transport and request.transport.get_extra_info("peercert"))
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})

    async def canary(self, request: web.Request) -> web.Response:
        self.peers.append(request.transport and request.transport.get_extra_info("peercert"))
        self.canaries += 1
        return web.json_response({"choices": [{"text": "pong"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.peers.append(request.transport and request.transport.get_extra_info("peercert"))
        body = await request.json()
        assert body["stream"] is True
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for word in WORDS:
            chunk = {"model": MODEL, "choices": [{"index": 0, "delta": {"content": word}}]}
            await out.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out


@contextlib.asynccontextmanager
async def serve_tls(app: web.Application, context: ssl.SSLContext) -> AsyncIterator[str]:
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    try:
        yield f"https://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def unit(certs: Certs) -> AsyncIterator[tuple[TlsUnit, str]]:
    server = TlsUnit()
    async with serve_tls(server.app, certs.server_context(require_client=True)) as url:
        yield server, url


def config(url: str, unit_tls: dict[str, str], **sections: Any) -> Any:
    raw: dict[str, Any] = {
        "gateway": {"port": 0, "models": [MODEL], "shutdown_timeout": 2.0},
        "metrics": {"port": 0},
        "routing": {"affinity": "none"},
        "health": HEALTH,
        "breaker": {"enabled": False},
        "admin": {"enabled": False},
        "units": [{"id": "t0", "leader": url, "kind": "openai", **unit_tls}],
    }
    for name, values in sections.items():
        raw[name] = {**raw[name], **values}
    return config_from_dict(raw)


def mtls(certs: Certs) -> dict[str, str]:
    return {
        "tls_ca": str(certs.ca),
        "tls_cert": str(certs.client_cert),
        "tls_key": str(certs.client_key),
    }


def listener(certs: Certs) -> dict[str, str]:
    return {"tls_cert": str(certs.server_cert), "tls_key": str(certs.server_key)}


async def test_a_stream_through_https_listeners_to_an_mtls_unit(
    certs: Certs, unit: tuple[TlsUnit, str]
) -> None:
    server, url = unit
    listeners = {"gateway": listener(certs), "metrics": listener(certs)}
    cfg = config(url, mtls(certs), health={**HEALTH, "canary_every": 1}, **listeners)
    async with running(cfg) as gw:
        assert gw.public_url.startswith("https://127.0.0.1:")
        assert gw.metrics_url.startswith("https://127.0.0.1:")
        await until_routable(gw, "t0")  # probed over mutual TLS
        connector = aiohttp.TCPConnector(ssl=certs.client_context())
        async with aiohttp.ClientSession(connector=connector) as http:
            async with http.post(f"{gw.public_url}/v1/chat/completions", json=chat_body()) as r:
                assert r.status == 200
                events = await sse_events(r)
            async with http.get(f"{gw.metrics_url}/metrics") as r:
                assert r.status == 200
                assert "unitgate_" in await r.text()
        async with aiohttp.ClientSession() as plain:  # the system's trust store: not ours
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await plain.get(f"{gw.public_url}/healthz")
            with pytest.raises(aiohttp.ClientError):  # plain HTTP on the HTTPS port
                await plain.get(gw.public_url.replace("https", "http") + "/healthz")
    text = "".join(e["choices"][0]["delta"]["content"] for e in events[:-1])
    assert text == "".join(WORDS) and events[-1] == "[DONE]"
    # Probes, the canary and the request alike presented the client certificate.
    assert server.canaries >= 1
    client = ((("commonName", "unitgate-test client"),),)
    assert len(server.peers) >= 2 and all(p["subject"] == client for p in server.peers)


async def test_a_unit_whose_certificate_the_ca_did_not_sign_is_not_routable(
    certs: Certs, stranger: Certs, unit: tuple[TlsUnit, str], caplog: pytest.LogCaptureFixture
) -> None:
    server, url = unit
    caplog.set_level(logging.INFO, "unitgate")
    wrong = {**mtls(certs), "tls_ca": str(stranger.ca)}
    async with running(config(url, wrong)) as gw:
        state = gw.units.units["t0"]
        await until(lambda: state.nodes[0].error is not None, 5.0, "first probe round")
        await until(lambda: "not trusted" in caplog.text, 5.0, "the unhealthy event")
        assert not state.routable
        error = state.nodes[0].error
        assert error is not None and "TLS: the node's certificate is not trusted" in error
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{gw.public_url}/v1/chat/completions", json=chat_body()) as r,
        ):
            assert r.status == 503
    assert server.peers == []  # no request ever reached it


async def test_an_mtls_unit_refuses_a_gateway_without_a_client_certificate(
    certs: Certs, unit: tuple[TlsUnit, str]
) -> None:
    server, url = unit
    async with running(config(url, {"tls_ca": str(certs.ca)})) as gw:
        state = gw.units.units["t0"]
        await until(lambda: state.nodes[0].error is not None, 5.0, "first probe round")
        assert not state.routable
        error = state.nodes[0].error
        assert error is not None and "may not accept the gateway's client certificate" in error
    assert server.peers == []


@pytest.mark.parametrize(
    ("section", "values", "message"),
    [
        ("gateway", {"tls_cert": "CERT"}, r"\[gateway\]\.tls_key is missing: tls_cert is set"),
        ("metrics", {"tls_key": "KEY"}, r"\[metrics\]\.tls_cert is missing"),
        (
            "gateway",
            {"tls_cert": "/nonexistent/cert.pem", "tls_key": "KEY"},
            r"\[gateway\]\.tls_cert cannot be read: No such file.*'/nonexistent/cert\.pem'",
        ),
        (
            "metrics",
            {"tls_cert": "CA", "tls_key": "KEY"},  # the CA's certificate with the server's key
            r"\[metrics\]\.tls_cert does not load with tls_key .*: the key does not belong",
        ),
        (
            "metrics",
            {"tls_cert": "KEY", "tls_key": "KEY"},
            r"\[metrics\]\.tls_cert does not load with tls_key .*: not a PEM certificate",
        ),
    ],
)
def test_listener_tls_errors_name_the_key_and_the_path(
    certs: Certs, section: str, values: dict[str, str], message: str
) -> None:
    paths = {"CERT": certs.server_cert, "KEY": certs.server_key, "CA": certs.ca}
    table = {k: str(paths.get(v, v)) for k, v in values.items()}
    with pytest.raises(ConfigError, match=message):
        config_from_dict({section: table})


def test_unit_tls_keys_are_checked(certs: Certs, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    unit = {"id": "t0", "leader": "https://127.0.0.1:1"}
    with pytest.raises(ConfigError, match=r"\[units\]\[0\]\.tls_ca is not a PEM certificate"):
        config_from_dict({"units": [{**unit, "tls_ca": str(junk)}]})
    with pytest.raises(ConfigError, match=r"\[units\]\[0\]\.tls_key is missing"):
        config_from_dict({"units": [{**unit, "tls_cert": str(certs.client_cert)}]})
    plain = {**unit, "leader": "http://127.0.0.1:1", "tls_ca": str(certs.ca)}
    with pytest.raises(ConfigError, match=r"tls_ca only applies to a unit with https:// nodes"):
        config_from_dict({"units": [plain]})
    assert config_from_dict({"units": [{**unit, **mtls(certs)}]}).units[0].tls_ca == str(certs.ca)


@pytest.mark.slow
def test_workers_serve_the_shared_port_over_https(certs: Certs, tmp_path: Path) -> None:
    """`workers = 2`: each worker applies the certificate where it creates its server on the
    shared port, and the ready file's public URL says https."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[gateway]\nport = 0\nworkers = 2\ntls_cert = "{certs.server_cert}"\n'
        f'tls_key = "{certs.server_key}"\n[metrics]\nport = 0\n[admin]\nenabled = false\n'
    )
    ready = tmp_path / "ready.json"
    argv = ["-m", "gateway", "gateway", "--config", str(config), "--ready-file", str(ready)]
    proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, stderr=subprocess.DEVNULL)
    try:
        info = wait_ready_blocking(ready, proc, 30.0, "the gateway")
        assert info["public"].startswith("https://127.0.0.1:"), info
        context = certs.client_context()
        for _ in range(4):  # a new connection each: the kernel spreads them over the workers
            with urllib.request.urlopen(info["public"] + "/healthz", context=context) as resp:
                assert resp.status == 200
    finally:
        assert stop_process(proc) == 0
