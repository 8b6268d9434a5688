"""One streaming chat completion, timed and classified.

Every failure is turned into an error kind on the record instead of an exception, so a
misbehaving server (refusing, resetting, answering HTML) shows up in the report and never
stops the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import time
from dataclasses import dataclass, field

import aiohttp
import orjson

from loadtest.gen.workload import RequestSpec

CHAT_PATH = "/v1/chat/completions"
# A well-behaved server ends the body right after [DONE]; longer than this, we stop waiting.
SETTLE_S = 0.2


class StreamError(Exception):
    """The response was not the SSE stream we expect; `kind` names how."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


@dataclass(slots=True)
class RequestRecord:
    """Times are seconds from the run's start; `scheduled` is when the request was due."""

    index: int
    scheduled: float
    session_id: str | None = None
    input_words: int | None = None
    max_tokens: int | None = None
    status: int | None = None
    error: str | None = None
    ttft: float | None = None
    e2e: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    token_times: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def tpot(self) -> float | None:
        """Decode time per output token after the first; undefined for one-token answers."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass(slots=True)
class _Stream:
    content_chunks: int = 0
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    done_at: float | None = None

    @property
    def done(self) -> bool:
        return self.done_at is not None


def open_session(concurrency: int | None) -> aiohttp.ClientSession:
    """A session whose pool holds `concurrency` connections, or any number for an open loop.

    aiohttp's default pool of 100 would silently queue requests beyond it inside the client
    and pass the wait off as server latency; the load shape is what must bound the load.
    """
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency or 0))


def pool_limit(session: aiohttp.ClientSession) -> int | None:
    """The session's connection cap, None when it has none."""
    connector = session.connector
    return (connector.limit or None) if connector is not None else None


def classify(exc: BaseException) -> str:
    """Map a client-side exception to a stable error kind for the report."""
    if isinstance(exc, StreamError):
        return exc.kind
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        refused = exc.os_error.errno == errno.ECONNREFUSED
        return "connection_refused" if refused else "connection_error"
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
        return "broken_stream"
    if isinstance(exc, aiohttp.ClientOSError | ConnectionError):
        return "broken_stream"
    if isinstance(exc, aiohttp.ClientResponseError):
        return "bad_response"
    if isinstance(exc, aiohttp.ClientError):
        return "client_error"
    return f"unexpected_{type(exc).__name__}"


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    spec: RequestSpec,
    record: RequestRecord,
    origin: float,
    timeout_s: float,
) -> RequestRecord:
    """Run one request; latencies are measured from `record.scheduled`, not the send time.

    The end of the response after [DONE] is read outside the request's timeout, so a server
    slow to close the stream can cost its connection but never fail a completed request.
    """
    record.session_id = spec.session_id
    record.input_words, record.max_tokens = spec.input_words, spec.max_tokens
    headers = {"Content-Type": "application/json"}
    if spec.session_id is not None:
        headers["x-session-id"] = spec.session_id
    resp: aiohttp.ClientResponse | None = None
    try:
        try:
            async with asyncio.timeout(timeout_s):
                resp = await session.post(base_url + CHAT_PATH, data=spec.body, headers=headers)
                await _read(resp, record, origin)
        except Exception as exc:  # any failure is data for the report, never a crash
            record.error = classify(exc)
        else:
            await _settle(resp)
    finally:
        if resp is not None:
            resp.release()
    return record


async def _read(resp: aiohttp.ClientResponse, record: RequestRecord, origin: float) -> None:
    record.status = resp.status
    if resp.status != 200:
        await resp.read()
        raise StreamError(f"http_{resp.status}")
    if not resp.content_type.startswith("text/event-stream"):
        raise StreamError("not_sse")
    stream = _Stream()
    async for raw in resp.content:
        _on_line(raw, stream, record, origin)
        if stream.done:
            break
    _finish(stream, record)


async def _settle(resp: aiohttp.ClientResponse) -> None:
    """Reads what follows [DONE], normally just the end of the chunked body: aiohttp closes a
    connection released with its body unread, and every request would then pay a new one."""
    with contextlib.suppress(TimeoutError, aiohttp.ClientError, OSError):
        async with asyncio.timeout(SETTLE_S):
            while await resp.content.readany():
                pass


def _on_line(raw: bytes, stream: _Stream, record: RequestRecord, origin: float) -> None:
    line = raw.strip()
    if not line.startswith(b"data:"):
        return  # blank separators, comments and other SSE fields carry no tokens
    data = line[5:].strip()
    if data == b"[DONE]":
        stream.done_at = time.perf_counter() - origin
        return
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise StreamError("malformed_sse") from None
    if not isinstance(chunk, dict):
        raise StreamError("malformed_sse")
    _read_chunk(chunk, stream, record, time.perf_counter() - origin)


def _read_chunk(chunk: dict[str, object], stream: _Stream, rec: RequestRecord, now: float) -> None:
    if "error" in chunk:
        raise StreamError("stream_error_event")
    usage = chunk.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        stream.usage_tokens = usage["completion_tokens"]
        prompt = usage.get("prompt_tokens")
        stream.prompt_tokens = prompt if isinstance(prompt, int) else None
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return
    for choice in choices:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        text = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(text, str) and text:
            if rec.ttft is None:
                rec.ttft = now - rec.scheduled
            rec.token_times.append(now)
            stream.content_chunks += 1


def _finish(stream: _Stream, record: RequestRecord) -> None:
    if stream.done_at is None:
        raise StreamError("missing_done")
    record.e2e = stream.done_at - record.scheduled
    count = stream.usage_tokens
    record.output_tokens = count if count is not None else stream.content_chunks
    record.prompt_tokens = stream.prompt_tokens
    if record.ttft is None:
        raise StreamError("no_tokens")
