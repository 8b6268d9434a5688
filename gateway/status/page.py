"""`GET /status`: the status page, and `GET /status/stream`: its live updates (SSE).

The page is plain HTML, CSS and one small script served from this package: no build step, no
CDN, so it works on an operator network with no way out. The page itself holds no data and is
open; the stream carries the fleet's state and follows the admin API's rules (a token, unless
the admin is open on loopback), sent by the script as a Bearer header (it reads the stream
with fetch, since EventSource cannot send one). Its buttons call the admin API itself.
A link `/status#token=...` (what `unitgate up` prints) signs the page in: the script takes the
token from the URL's fragment, which the browser never sends here, so no request and no log
holds it. The page's charts (charts.js) draw each unit's `traffic` from the same stream, and
its classes and tenants tables (classes.js) the snapshot's `classes` and `tenants`, and its
rollout card (rollout.js) the snapshot's `rollout`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from gateway.admin.auth import Authenticator
from gateway.errors import GatewayError
from gateway.status.feed import END, StatusFeed

STATIC = Path(__file__).parent / "static"
FILES = {
    "status.js": "text/javascript",
    "charts.js": "text/javascript",
    "classes.js": "text/javascript",
    "rollout.js": "text/javascript",
    "status.css": "text/css",
}


class StatusPage:
    def __init__(self, feed: StatusFeed, auth: Callable[[], Authenticator]) -> None:
        self.feed = feed
        self._auth = auth

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/status", self.page),
            web.get("/status/stream", self.stream),
            web.get("/status/{name}", self.static),
        ]

    async def page(self, request: web.Request) -> web.StreamResponse:
        return _file("status.html", "text/html")

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in FILES:
            raise web.HTTPNotFound()
        return _file(name, FILES[name])

    async def stream(self, request: web.Request) -> web.StreamResponse:
        try:
            self._auth().who(request.headers.get("Authorization"))
        except GatewayError as exc:
            return exc.response()
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
        )
        await response.prepare(request)
        async with self.feed.watch() as queue:
            try:
                while (data := await queue.get()) != END:
                    await response.write(data)
            except ConnectionResetError:  # the page was closed
                pass
        return response


def _file(name: str, content_type: str) -> web.FileResponse:
    response = web.FileResponse(STATIC / name)
    response.content_type = content_type
    response.headers["Cache-Control"] = "no-cache"
    return response
