"""Hostile HTTP/1.1 heads, the request-smuggling classics among them, sent raw to two gateways
in front of recording units: one on the lean front, one on aiohttp's (the reference). Each
must get the same answers from both, and what reaches a unit must be the same: nothing, or
requests whose bodies arrive whole, each exactly as often as aiohttp lets it through.

The corpus is written here from the HTTP/1.1 grammar (RFC 9112) and the known smuggling shapes
(CL.TE, TE.CL, TE.TE, duplicate or malformed lengths, obs-fold, bare LF, odd targets), not
from the lean front's own rules in head.py, so that it tests them rather than restates them.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.front.head import MAX_HEAD, MAX_LINE
from gateway.paths import CHAT_PATH
from tests.gateway.front.front_support import (
    Recorder,
    chat_bytes,
    gateway,
    recording_unit,
    transcript,
)

CRLF = "\r\n"
ECHO = "echo-me"  # an x-request-id the gateway echoes, read exactly as aiohttp reads it
JSON = "Content-Type: application/json"  # else the gateway refuses the body, as vLLM does


class Case:
    """One hostile request: its bytes, and the bodies that may reach a unit whole."""

    def __init__(self, name: str, head: str, body: bytes = b"", *whole: bytes) -> None:
        self.name = name
        self.data = head.encode("latin-1") + body
        self.whole = frozenset(whole)


def _body(name: str) -> bytes:
    return chat_bytes(f"case {name}")


def _smuggled(name: str) -> tuple[bytes, bytes]:
    """A whole second request hidden where a body is, and its own body."""
    body = chat_bytes(f"smuggled {name}")
    head = f"POST {CHAT_PATH} HTTP/1.1{CRLF}Host: x{CRLF}{JSON}{CRLF}"
    head += f"Content-Length: {len(body)}{CRLF}{CRLF}"
    return head.encode() + body, body


def _head(*fields: str, line: str = f"POST {CHAT_PATH} HTTP/1.1", eol: str = CRLF) -> str:
    return eol.join([line, "Host: x", JSON, *fields]) + eol + eol


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data)


def _with_length(name: str, *fields: str, line: str = f"POST {CHAT_PATH} HTTP/1.1") -> Case:
    """The case's whole body with a right Content-Length, and `fields` besides."""
    body = _body(name)
    return Case(name, _head(f"Content-Length: {len(body)}", *fields, line=line), body, body)


def _length_field(name: str, field: str) -> Case:
    """A Content-Length field of the case's own spelling (`{n}`: the body's length)."""
    body = _body(name)
    return Case(name, _head(field.format(n=len(body))), body, body)


# Two framings of one payload: a reader that takes it as chunked ends the body at once, at
# the zero chunk (TE wins); one that takes Content-Length ({cl}: all of it) reads on.
_TE_VERSUS_CL = {
    "CL.TE": ["Content-Length: {cl}", "Transfer-Encoding: chunked"],
    "TE.CL": ["Transfer-Encoding: chunked", "Content-Length: {cl}"],
    "CL.TE-xchunked": ["Content-Length: {cl}", "Transfer-Encoding: xchunked"],
    "CL.TE-space-colon": ["Content-Length: {cl}", "Transfer-Encoding : chunked"],
    "CL.TE-tab": ["Content-Length: {cl}", "Transfer-Encoding:\tchunked"],
    "CL.TE-folded": ["Content-Length: {cl}", "Transfer-Encoding:", " chunked"],
    "CL.TE-twice": ["Content-Length: {cl}", "Transfer-Encoding: chunked", "Transfer-Encoding: x"],
    "CL.TE-list": ["Content-Length: {cl}", "Transfer-Encoding: chunked, identity"],
    "TE-identity": ["Content-Length: {cl}", "Transfer-Encoding: identity"],
}
# A payload of the case's body then a whole request: a reader that takes the short length
# ({short}: the body's) serves both; one that takes all of it ({cl}) sees one bad body.
_LENGTH_VERSUS_LENGTH = {
    "CL.CL": ["Content-Length: {short}", "Content-Length: {cl}"],
    "CL.CL-same": ["Content-Length: {cl}", "Content-Length: {cl}"],
    "CL-list": ["Content-Length: {cl}, {cl}"],
    "CL-space-colon": ["Content-Length : {cl}"],
    "CL-tab-colon": ["Content-Length\t: {cl}"],
    "CL-folded": ["Content-Length:", " {cl}"],
    "CL-short": ["Content-Length: {short}"],
}


def _smuggling() -> list[Case]:
    cases = []
    for table, first in ((_TE_VERSUS_CL, False), (_LENGTH_VERSUS_LENGTH, True)):
        for name, fields in table.items():
            smuggled, inner = _smuggled(name)
            body = _body(name)
            payload = (body if first else b"0\r\n\r\n") + smuggled
            values = {"cl": len(payload), "short": len(body)}
            head = _head(*(f.format(**values) for f in fields))
            cases.append(Case(name, head, payload, body, inner))
    te_body = _body("TE-chunked")
    head = _head("Transfer-Encoding: chunked")
    cases.append(Case("TE-chunked", head, _chunked(te_body), te_body))
    return cases


def _malformed() -> list[Case]:
    body = _body("x")
    n = len(body)
    return [
        _length_field("CL-plus", "Content-Length: +{n}"),
        _length_field("CL-minus", "Content-Length: -{n}"),
        _length_field("CL-hex", "Content-Length: 0x{n}"),
        _length_field("CL-ows", "Content-Length:   {n}   "),
        _length_field("CL-leading-zeros", "Content-Length: 000{n}"),
        _length_field("CL-letters", "Content-Length: {n}a"),
        _length_field("CL-empty", "Content-Length:"),
        _length_field("CL-overflow", "Content-Length: 184467440737095516160"),
        _length_field("CL-NUL", "Content-Length: {n}\0"),
        _with_length("obs-fold", "X-A: a", " b"),
        _with_length("obs-fold-tab", "X-A: a", "\tb"),
        Case("bare-LF", _head(f"Content-Length: {n}", eol="\n"), body, body),
        Case("bare-LF-mixed", _head(f"Content-Length: {n}\nX-A: a"), body, body),
        Case("bare-CR", _head(f"Content-Length: {n}\rX-A: a"), body, body),
        _with_length("NUL-value", "X-A: a\0b"),
        _with_length("NUL-name", "X-\0A: a"),
        _with_length("NUL-target", line=f"POST {CHAT_PATH}\0 HTTP/1.1"),
        _with_length("space-in-name", "X A: a"),
        _with_length("at-in-name", "X@A: a"),
        _with_length("empty-name", ": a"),
        _with_length("no-colon", "X-A a"),
        _with_length("high-bytes", "X-A: \xff\xfe"),
        _with_length("long-value", "X-A: " + "a" * (MAX_LINE + 1)),
        _with_length("long-name", "X" * (MAX_LINE + 1) + ": a"),
        _with_length("long-target", line=f"POST {CHAT_PATH}?{'q' * MAX_LINE} HTTP/1.1"),
        _with_length("long-head", *(f"X-{i}: {'a' * 100}" for i in range(MAX_HEAD // 100))),
        _with_length("many-fields", *(f"X-{i}: {i}" for i in range(200))),
        _with_length("two-hosts", "Host: y"),
        _with_length("two-content-types", "Content-Type: a/b", "Content-Type: c/d"),
        _with_length("two-user-agents", "User-Agent: a", "User-Agent: b"),
        _with_length("two-expects", "Expect: 100-continue", "Expect: 100-continue"),
        _with_length("trailing-ows", f"x-request-id: {ECHO} \t "),
        _with_length("trailing-ows-expect", "Expect: 100-continue \t"),
        _with_length("trailing-ows-encoding", "Content-Encoding: identity\t "),
    ]


def _lines() -> list[Case]:
    chat = CHAT_PATH
    return [
        _with_length("absolute-form", line=f"POST http://x{chat} HTTP/1.1"),
        _with_length("absolute-form-other-host", line=f"POST http://evil.example{chat} HTTP/1.1"),
        _with_length("authority-form", line="POST x:80 HTTP/1.1"),
        _with_length("asterisk-form", line="POST * HTTP/1.1"),
        _with_length("dot-segments", line="POST /v1/../v1/chat/completions HTTP/1.1"),
        _with_length("encoded-path", line="POST /v1/chat%2Fcompletions HTTP/1.1"),
        _with_length("fragment", line=f"POST {chat}#x HTTP/1.1"),
        _with_length("query", line=f"POST {chat}?a=1 HTTP/1.1"),
        _with_length("lowercase-method", line=f"post {chat} HTTP/1.1"),
        _with_length("double-space", line=f"POST  {chat} HTTP/1.1"),
        _with_length("tab-separator", line=f"POST\t{chat}\tHTTP/1.1"),
        _with_length("trailing-space", line=f"POST {chat} HTTP/1.1 "),
        _with_length("HTTP/1.0", line=f"POST {chat} HTTP/1.0"),
        _with_length("HTTP/1.2", line=f"POST {chat} HTTP/1.2"),
        _with_length("HTTP/2.0", line=f"POST {chat} HTTP/2.0"),
        _with_length("lowercase-version", line=f"POST {chat} http/1.1"),
        _with_length("no-version", line=f"POST {chat}"),
        _with_length("GET-with-body", line=f"GET {chat} HTTP/1.1"),
        _with_length("PUT", line=f"PUT {chat} HTTP/1.1"),
        Case("no-host", f"POST {chat} HTTP/1.1{CRLF}Content-Length: 2{CRLF}{CRLF}", b"{}"),
        _with_length("expect-continue", "Expect: 100-continue"),
        _with_length("expect-other", "Expect: 100-continue, x"),
        _with_length("upgrade", "Connection: Upgrade", "Upgrade: h2c"),
        _with_length("connection-close", "Connection: close"),
        _with_length("content-encoding-gzip", "Content-Encoding: gzip"),
        _with_length("content-encoding-identity", "Content-Encoding: identity"),
    ]


def _pipelined() -> list[Case]:
    cases = []
    for name, before in [("pipelined", ""), ("pipelined-after-aiohttps", "GET /v1/models")]:
        first, second = _body(name), chat_bytes(f"second {name}")
        heads = [_head(f"Content-Length: {len(b)}") for b in (first, second)]
        ahead = _head(line=f"{before} HTTP/1.1") if before else ""
        data = (ahead + heads[0]).encode() + first + heads[1].encode() + second
        cases.append(Case(name, "", data, first, second))
    return cases


CORPUS = [*_smuggling(), *_malformed(), *_lines(), *_pipelined()]


def _case_of(body: bytes) -> str:
    """The name of the case a body that reached a unit came from."""
    content = body.split(b'"content":"', 1)[-1].split(b'"', 1)[0].decode("latin-1")
    return content.split(" ", 1)[-1]


Seen = tuple[list[tuple[int, bool]], list[bytes]]


async def _answers(port: int, recorder: Recorder) -> dict[str, Seen]:
    """Every case sent at once, each on its own connection: its answers (status, and whether
    ECHO came back as the request's id) and the bodies that reached the unit for it.

    A 100 Continue is left out: it is no answer but an interim response, which a server may
    omit when the body has already come (RFC 9110, 10.1.1). The lean front does; aiohttp sends
    it anyway. (That the lean front still sends it when the body is awaited, and not when it
    refuses on the length, test_front.py and test_front_linger.py show.)"""
    sent = await asyncio.gather(*(transcript(port, case.data, quiet=1.0) for case in CORPUS))
    reached: dict[str, list[bytes]] = {}
    for body in recorder.bodies:
        reached.setdefault(_case_of(body), []).append(body)
    seen: dict[str, Seen] = {}
    for case, answers in zip(CORPUS, sent, strict=True):
        final = [(status, h.get("x-request-id") == ECHO) for status, h in answers if status != 100]
        seen[case.name] = (final, sorted(reached.get(case.name, [])))
    return seen


async def test_hostile_heads_are_answered_as_aiohttp_answers_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with (
        recording_unit() as (lean_unit, lean_url),
        recording_unit() as (aio_unit, aio_url),
        gateway(monkeypatch, "lean", lean_url) as lean,
        gateway(monkeypatch, "aiohttp", aio_url) as aio,
    ):
        lean_port, aio_port = (int(g.public_url.rsplit(":", 1)[1]) for g in (lean, aio))
        got, want = await asyncio.gather(
            _answers(lean_port, lean_unit), _answers(aio_port, aio_unit)
        )
    differ = {name: (got[name], want[name]) for name in got if got[name] != want[name]}
    assert not differ, "\n".join(f"{n}: lean {g}, aiohttp {w}" for n, (g, w) in differ.items())
    for case in CORPUS:
        answers, reached = got[case.name]
        assert answers, f"{case.name}: no answer"
        assert set(reached) <= case.whole, f"{case.name}: a body reached the unit cut or changed"
        assert len(reached) == len(set(reached)), f"{case.name}: a body reached the unit twice"
