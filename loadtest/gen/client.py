"""One chat or text completion, streamed or not, timed and classified.

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import aiohttp
import orjson

from loadtest.gen.tokens import TokenCounter, estimate_tokens
from loadtest.gen.workload import CHAT_PATH, RequestSpec

__all__ = ["CHAT_PATH", "RequestRecord", "StreamError", "classify", "open_session", "send"]
Headers = Sequence[tuple[str, str]]
# When a request ended: within the run's --duration (or a run without one), in the grace after
# it, or cut at the end of the grace while still in flight (neither a success nor a failure).
Ended = Literal["run", "grace", "cut"]
# A well-behaved server ends the body right after [DONE]; longer than this, we stop waiting.
SETTLE_S = 0.2


class StreamError(Exception):
    """The response was not the SSE stream we expect; `kind` names how."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


@dataclass(slots=True)
class RequestRecord:
    """Times are seconds from the run's start; `scheduled` is when the request was due.
    `ended` says when it ended (see `Ended`)."""

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
    input_tokens: int | None = None
    # How output_tokens was counted: usage, token_ids, tokenizer, chunks or estimate.
    tokens_from: str | None = None
    ended: Ended = "run"

    @property
    def ok(self) -> bool:
        """Answered in full; a request cut at the end of the grace did not fail either."""
        return self.error is None and self.ended != "cut"

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
    """What one answer carried; `texts` is kept only for a tokenizer or an estimate to count."""

    content_chunks: int = 0
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    done_at: float | None = None
    token_ids: int | None = None
    texts: list[str] | None = None

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


def request_headers(spec: RequestSpec, extra: Headers) -> dict[str, str]:
    """JSON content type, then the user's headers (which may replace it), then the session."""
    headers = {"Content-Type": "application/json"}
    for name, value in extra:
        for have in [h for h in headers if h.lower() == name.lower()]:
            del headers[have]
        headers[name] = value
    if spec.session_id is not None:
        headers["x-session-id"] = spec.session_id
    return headers


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    spec: RequestSpec,
    record: RequestRecord,
    origin: float,
    timeout_s: float,
    headers: Headers = (),
    tokenizer: TokenCounter | None = None,
) -> RequestRecord:
    """Run one request; latencies are measured from `record.scheduled`, not the send time.

    The end of the response after [DONE] is read outside the request's timeout, so a server
    slow to close the stream can cost its connection but never fail a completed request.
    `tokenizer` counts the answer when the server reports no usage.
    """
    record.session_id = spec.session_id
    record.input_words, record.max_tokens = spec.input_words, spec.max_tokens
    record.input_tokens = spec.input_tokens
    sent = request_headers(spec, headers)
    resp: aiohttp.ClientResponse | None = None
    try:
        try:
            async with asyncio.timeout(timeout_s):
                resp = await session.post(base_url + spec.path, data=spec.body, headers=sent)
                keep = tokenizer is not None or not spec.stream
                stream = _Stream(texts=[] if keep else None)
                if spec.stream:
                    await _read(resp, stream, record, origin)
                else:
                    await _read_whole(resp, stream, record, origin)
                _count(stream, record, tokenizer, spec.stream)
        except Exception as exc:  # any failure is data for the report, never a crash
            record.error = classify(exc)
        else:
            if spec.stream:
                await _settle(resp)
    finally:
        if resp is not None:
            resp.release()
    return record


async def _read(
    resp: aiohttp.ClientResponse, stream: _Stream, record: RequestRecord, origin: float
) -> None:
    await _check_status(resp, record)
    if not resp.content_type.startswith("text/event-stream"):
        raise StreamError("not_sse")
    async for raw in resp.content:
        _on_line(raw, stream, record, origin)
        if stream.done:
            break
    _finish(stream, record)


async def _check_status(resp: aiohttp.ClientResponse, record: RequestRecord) -> None:
    record.status = resp.status
    if resp.status != 200:
        await resp.read()
        raise StreamError(f"http_{resp.status}")


async def _read_whole(
    resp: aiohttp.ClientResponse, stream: _Stream, record: RequestRecord, origin: float
) -> None:
    """A non-streamed answer: one JSON body; it has an end-to-end time but no TTFT."""
    await _check_status(resp, record)
    raw = await resp.read()
    record.e2e = time.perf_counter() - origin - record.scheduled
    body = _object(raw, "not_json")
    if "error" in body:
        raise StreamError("error_body")
    _read_usage(body, stream)
    for choice in _choices(body):
        _add_text(_text(choice, "message"), choice, stream)
    record.prompt_tokens = stream.prompt_tokens


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
    chunk = _object(data, "malformed_sse")
    _read_chunk(chunk, stream, record, time.perf_counter() - origin)


def _object(raw: bytes, kind: str) -> dict[str, object]:
    """`raw` as a JSON object, or the StreamError `kind`."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise StreamError(kind) from None
    if not isinstance(value, dict):
        raise StreamError(kind)
    return value


def _text(choice: dict[str, object], holder: str) -> object:
    """A choice's text: chat's `holder` ("message" or "delta") `content`, else completions'
    `text`."""
    inner = choice.get(holder)
    return inner.get("content") if isinstance(inner, dict) else choice.get("text")


def _read_chunk(chunk: dict[str, object], stream: _Stream, rec: RequestRecord, now: float) -> None:
    """Chat chunks carry `delta.content`, completions chunks `text`; either may carry
    `token_ids` (vLLM's return_token_ids)."""
    if "error" in chunk:
        raise StreamError("stream_error_event")
    _read_usage(chunk, stream)
    for choice in _choices(chunk):
        if _add_text(_text(choice, "delta"), choice, stream):
            if rec.ttft is None:
                rec.ttft = now - rec.scheduled
            rec.token_times.append(now)


def _read_usage(body: dict[str, object], stream: _Stream) -> None:
    usage = body.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        stream.usage_tokens = usage["completion_tokens"]
        prompt = usage.get("prompt_tokens")
        stream.prompt_tokens = prompt if isinstance(prompt, int) else None


def _choices(body: dict[str, object]) -> list[dict[str, object]]:
    choices = body.get("choices")
    return [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []


def _add_text(text: object, choice: dict[str, object], stream: _Stream) -> bool:
    """Counts one piece of answer; False when it carried no text."""
    ids = choice.get("token_ids")
    if isinstance(ids, list):
        stream.token_ids = (stream.token_ids or 0) + len(ids)
    if not isinstance(text, str) or not text:
        return False
    stream.content_chunks += 1
    if stream.texts is not None:
        stream.texts.append(text)
    return True


def _finish(stream: _Stream, record: RequestRecord) -> None:
    if stream.done_at is None:
        raise StreamError("missing_done")
    record.e2e = stream.done_at - record.scheduled
    record.prompt_tokens = stream.prompt_tokens
    if record.ttft is None:
        raise StreamError("no_tokens")


def _count(
    stream: _Stream, record: RequestRecord, tokenizer: TokenCounter | None, streamed: bool
) -> None:
    """Output tokens from the best source the answer allows, and which one it was."""
    texts = stream.texts
    if stream.usage_tokens is not None:
        record.output_tokens, record.tokens_from = stream.usage_tokens, "usage"
    elif stream.token_ids is not None:
        record.output_tokens, record.tokens_from = stream.token_ids, "token_ids"
    elif tokenizer is not None and texts is not None:
        record.output_tokens = tokenizer.count("".join(texts))
        record.tokens_from = "tokenizer"
    elif streamed:
        record.output_tokens, record.tokens_from = stream.content_chunks, "chunks"
    else:
        record.output_tokens = estimate_tokens("".join(texts or ()))
        record.tokens_from = "estimate"
    if not streamed and stream.content_chunks == 0 and not record.output_tokens:
        raise StreamError("no_tokens")
