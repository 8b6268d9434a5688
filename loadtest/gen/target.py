"""What the load generator needs to know about its target before the load: the headers every
request carries (`--api-key`, `--header`) and, without `--model`, the model it serves.

The API key comes from `--api-key` or the `UNITGATE_API_KEY` environment variable, never from
`OPENAI_API_KEY`: a personal OpenAI key set in a shell must not go to a test server unasked.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping, Sequence

import aiohttp
import orjson

from loadtest.gen.client import classify

API_KEY_ENV = "UNITGATE_API_KEY"
MODELS_PATH = "/v1/models"
LIST_TIMEOUT_S = 10.0
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)


class TargetError(Exception):
    """The target could not tell us what we need; the message says what to give instead."""


def parse_header(text: str) -> tuple[str, str]:
    """`Name: value` as curl takes it; raises ValueError with the reason."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not _TOKEN.match(name):
        raise ValueError(f"--header {text!r}: expected 'Name: value'")
    if "\r" in value or "\n" in value:
        raise ValueError(f"--header {name}: a value cannot hold a line break")
    return name, value


def build_headers(
    raw: Sequence[str], api_key: str | None, env: Mapping[str, str] = os.environ
) -> tuple[tuple[str, str], ...]:
    """The headers every request sends; `--api-key` (or the environment) as a Bearer token."""
    headers = [parse_header(h) for h in raw]
    key = api_key if api_key is not None else env.get(API_KEY_ENV) or None
    if key is not None:
        if any(name.lower() == "authorization" for name, _ in headers):
            raise ValueError("give --api-key (or UNITGATE_API_KEY) or an Authorization --header")
        headers.insert(0, ("Authorization", f"Bearer {key}"))
    return tuple(headers)


async def list_models(url: str, headers: Sequence[tuple[str, str]]) -> list[str]:
    """The model ids `GET /v1/models` lists, in its order."""
    where = url + MODELS_PATH
    try:
        async with (
            asyncio.timeout(LIST_TIMEOUT_S),
            aiohttp.ClientSession() as session,
            session.get(where, headers=dict(headers)) as resp,
        ):
            body = await resp.read()
            status = resp.status
    except Exception as exc:  # named for the message, never a traceback
        raise TargetError(f"cannot list models at {where}: {classify(exc)}") from None
    if status != 200:
        raise TargetError(f"cannot list models at {where}: HTTP {status}")
    return _ids(body, where)


def _ids(body: bytes, where: str) -> list[str]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise TargetError(f"{where} did not answer JSON") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise TargetError(f"{where} has no 'data' list")
    ids = [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if not ids:
        raise TargetError(f"{where} lists no model")
    return ids


def choose_model(ids: list[str]) -> tuple[str, str]:
    """The model to load and a line saying why: the only one, or the first of several."""
    if len(ids) == 1:
        return ids[0], f"model: {ids[0]} (the one listed at {MODELS_PATH})"
    shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
    return ids[0], (
        f"model: {ids[0]}, the first of {len(ids)} listed at {MODELS_PATH} ({shown}); "
        f"choose another with --model"
    )
