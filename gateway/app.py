"""The gateway's HTTP surfaces: the public OpenAI API and the operator listener (metrics, admin)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from prometheus_client.exposition import choose_encoder

from gateway import cors
from gateway.config import Config
from gateway.errors import GatewayError, InvalidRequest
from gateway.observability.metrics import Metrics
from gateway.paths import RESPONSES_PATH, TOKENIZER_INFO_PATH
from gateway.proxy.cards import UnitCards
from gateway.proxy.handler import ProxyHandler, Route
from gateway.status.page import StatusPage
from gateway.units import UnitRegistry

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def public_app(
    config: Config, proxy: ProxyHandler, units: UnitRegistry, draining: Callable[[], bool]
) -> web.Application:
    # No middleware of its own (see _json_fallbacks); CORS, when on, adds one.
    app = web.Application(client_max_size=config.gateway.max_body_bytes)
    cors.install(app, config.gateway.cors_origins)
    cards = UnitCards(config, units, proxy.dispatcher.upstream)

    async def models(_: web.Request) -> web.Response:
        return _json(200, {"object": "list", "data": await cards.listed()})

    async def model(request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name not in config.gateway.models:
            message = f"The model '{name}' does not exist"
            return InvalidRequest(message, status=404, code="model_not_found").response()
        await cards.listed()
        return _json(200, cards.card(name))

    async def version(_: web.Request) -> web.Response:
        return _json(200, await cards.version())

    async def healthz(_: web.Request) -> web.Response:
        return _json(200, {"status": "ok"})

    def unready() -> str | None:
        if draining():
            return "draining"
        return None if units.any_routable() else "no routable unit"

    async def readyz(_: web.Request) -> web.Response:
        why = unready()
        return _json(503, {"status": why}) if why else _json(200, {"status": "ready"})

    async def health(_: web.Request) -> web.Response:
        """vLLM's `/health` (and SageMaker's `/ping`): /readyz's verdict, vLLM's empty body."""
        return web.Response(status=503 if unready() else 200)

    root = config.gateway.root_path
    for path, route in lean_routes(proxy, root).items():
        app.router.add_post(path, route)

    def keyed(handler: Handler) -> Handler:
        """A data-plane route: the API key is checked as on the request path."""

        async def checked(request: web.Request) -> web.StreamResponse:
            try:
                proxy.gate.caller(request.headers.get("Authorization"))
            except GatewayError as exc:
                return exc.response()
            return await handler(request)

        return checked

    others: list[tuple[str, str, Handler]] = [
        ("GET", TOKENIZER_INFO_PATH, proxy.tokenizer_info),
        ("GET", RESPONSES_PATH + "/{id}", proxy.stored_response),
        ("POST", RESPONSES_PATH + "/{id}/cancel", proxy.cancel_response),
        ("GET", "/v1/models", keyed(models)),
        ("GET", "/v1/models/{model:.+}", keyed(model)),
        ("GET", "/healthz", healthz),
        ("GET", "/readyz", readyz),
        ("GET", "/health", health),
        ("GET", "/ping", health),
        ("POST", "/ping", health),
        ("GET", "/version", version),
    ]
    for method, path, handler in others:
        for at in rooted(path, root):
            app.router.add_route(method, at, handler)
    _json_fallbacks(app)
    return app


def lean_routes(proxy: ProxyHandler, root_path: str) -> dict[str, Route]:
    """The proxy's routes (POST): what the lean front serves itself (gateway/front), each
    also under `[gateway].root_path` when one is set."""
    return {at: route for path, route in proxy.posts.items() for at in rooted(path, root_path)}


def rooted(path: str, root_path: str) -> tuple[str, ...]:
    """Where a public route is served: its path, and the same under the root path (vLLM's
    `--root-path` answers both)."""
    return (path, root_path + path) if root_path else (path,)


def _json_fallbacks(app: web.Application) -> None:
    """The JSON 405 and 404 answers `_json_errors` gives, as routes rather than a middleware:
    aiohttp wraps every request of an app with middlewares in two more coroutines (its own and
    the middleware), the streamed ones included, which costs CPU and memory per open stream."""
    for resource in list(app.router.resources()):
        assert isinstance(resource, web.Resource)  # plain and dynamic paths, no static files
        allowed = ", ".join(sorted({route.method for route in resource}))

        async def not_allowed(request: web.Request, allowed: str = allowed) -> web.Response:
            response = _error(request, "Method Not Allowed", 405)
            response.headers["Allow"] = allowed
            return response

        resource.add_route("*", not_allowed)

    async def not_found(request: web.Request) -> web.Response:
        return _error(request, "Not Found", 404)

    app.router.add_route("*", "/{tail:.*}", not_found)


def _error(request: web.Request, reason: str, status: int) -> web.Response:
    return InvalidRequest(f"{request.method} {request.path}: {reason}", status=status).response()


def ops_app(
    metrics: Metrics, admin: web.Application | None = None, status: StatusPage | None = None
) -> web.Application:
    """/metrics (never authenticated) and, when enabled, the admin API under /admin/ and the
    status page at /status."""
    app = web.Application(middlewares=[_json_errors])

    async def render(request: web.Request) -> web.Response:
        if metrics.refresh is not None:
            await metrics.refresh()
        # The Prometheus text format, or OpenMetrics when the scraper's Accept asks for it.
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = await asyncio.to_thread(metrics.render, encoder)
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.router.add_get("/metrics", render)
    if admin is not None:
        app.add_subapp("/admin/", admin)  # its own middleware authenticates its routes only
    if status is not None:
        app.add_routes(status.routes())
        app.on_shutdown.append(lambda _app: status.feed.close())  # open pages' streams end
    return app


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own 404/405 pages are HTML; OpenAI clients expect a JSON error body."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = _error(request, exc.reason, exc.status)
        if isinstance(exc, web.HTTPMethodNotAllowed):
            response.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
        return response


def _json(status: int, payload: object) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(payload), content_type="application/json")
