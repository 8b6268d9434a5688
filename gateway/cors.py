"""CORS for browser clients of the public API (`[gateway].cors_origins`).

A preflight (OPTIONS with Access-Control-Request-Method) from an allowed origin is answered
here, 204, before routing. Every other answer to an allowed origin gets its CORS headers in
`on_response_prepare`, which runs as the head is written: a streamed answer carries them too,
before its first byte. An origin not on the list gets no CORS headers at all, so the browser
refuses it; with no origins configured nothing is installed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ALLOW_METHODS = "GET, POST, OPTIONS"
# Always allowed besides what the preflight asks for (the official SDKs add their own).
ALLOW_HEADERS = ("Authorization", "Content-Type", "X-Request-Id", "X-Session-Id")
EXPOSE_HEADERS = "X-Request-Id, Retry-After"
MAX_AGE = "600"  # seconds a browser may cache a preflight's answer


def allowed_origin(origins: frozenset[str], origin: str | None) -> str | None:
    """The Access-Control-Allow-Origin value for a request from `origin`, or None."""
    if not origin:
        return None
    if origin in origins:
        return origin
    return "*" if "*" in origins else None


def allow_headers(requested: str) -> str:
    """The base list and whatever header names the preflight asked for, each once."""
    names = {name.lower(): name for name in ALLOW_HEADERS}
    for asked in requested.split(","):
        name = asked.strip()
        if name:
            names.setdefault(name.lower(), name)
    return ", ".join(names.values())


class Cors:
    def __init__(self, origins: tuple[str, ...]) -> None:
        self.origins = frozenset(origins)

    @web.middleware
    async def preflight(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != hdrs.METH_OPTIONS or hdrs.ACCESS_CONTROL_REQUEST_METHOD not in (
            request.headers
        ):
            return await handler(request)
        if allowed_origin(self.origins, request.headers.get(hdrs.ORIGIN)) is None:
            return await handler(request)  # no CORS for it: the router's own answer (405)
        requested = request.headers.get(hdrs.ACCESS_CONTROL_REQUEST_HEADERS, "")
        return web.Response(
            status=204,
            headers={
                hdrs.ACCESS_CONTROL_ALLOW_METHODS: ALLOW_METHODS,
                hdrs.ACCESS_CONTROL_ALLOW_HEADERS: allow_headers(requested),
                hdrs.ACCESS_CONTROL_MAX_AGE: MAX_AGE,
            },
        )

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Runs as any answer's head is about to be written."""
        headers = response.headers
        vary = headers.get(hdrs.VARY, "")
        if "origin" not in vary.lower():  # caches must not hand one origin's answer to another
            headers[hdrs.VARY] = f"{vary}, Origin" if vary else "Origin"
        origin = allowed_origin(self.origins, request.headers.get(hdrs.ORIGIN))
        if origin is None:
            return
        headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = origin
        if request.method != hdrs.METH_OPTIONS:
            headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = EXPOSE_HEADERS


def install(app: web.Application, origins: tuple[str, ...]) -> None:
    """CORS on `app` for `origins` ("*" = any); nothing when there are none."""
    if not origins:
        return
    cors = Cors(origins)
    app.middlewares.insert(0, cors.preflight)
    app.on_response_prepare.append(cors.on_prepare)
