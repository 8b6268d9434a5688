"""JSON responses for the simulated units test tool, encoded with orjson like the gateway."""

from __future__ import annotations

import orjson
from aiohttp import web


def json_response(body: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")
