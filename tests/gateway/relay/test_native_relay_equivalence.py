"""The native relay against the Python one: the same upstream bytes, split at any byte, must
give the client the same bytes (write for write), leave the tracker and the usage reader in
the same state, and end the same way.

The streams are the recorded answers of stock vLLM, the builtin engine and the simulated units
(tests/data), and generated ones: every token-chunk shape those servers send, multi-byte
UTF-8, comments, CRLF events, error events, usage chunks, a missing [DONE], events after the
end; framed as chunks of any size, by a Content-Length or until the close.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.relay.native_support import (
    CLIENT_HEAD,
    SSE_HEAD,
    ClientSide,
    Outcome,
    chunked,
    native,
    relay_reads,
    split,
    unframe,
)

DATA = Path(__file__).parents[2] / "data"
CHUNKED = SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n"


def _recorded() -> list[tuple[str, bytes, dict[str, Any]]]:
    out = []
    for entry in orjson.loads((DATA / "streams" / "index.json").read_bytes()):
        body = (DATA / "streams" / entry["file"]).read_bytes()
        opts = {"chat": entry["chat"], "client_ids": entry["client_ids"]}
        out.append((entry["file"], body, {**opts, "include_usage": entry["include_usage"]}))
    for path in sorted((DATA / "vllm").glob("*.sse")):
        chat = not path.name.startswith(("completions", "responses", "messages"))
        out.append((path.name, path.read_bytes(), {"chat": chat, "client_ids": False}))
    return out


RECORDED = _recorded()


def both(reads: list[bytes], **kwargs: Any) -> tuple[Outcome, Outcome]:
    py = relay_reads(None, reads, **kwargs)
    nat = relay_reads(native(), reads, **kwargs)
    return py, nat


def assert_same(
    py: Outcome, nat: Outcome, pumps: tuple[str, str] = ("PythonPump", "NativePump")
) -> None:
    assert (py.pump, nat.pump) in {pumps, ("", "")}  # "": no answer
    assert [unframe(w) for w in nat.writes] == [unframe(w) for w in py.writes]
    assert nat.writes == py.writes
    assert (nat.end, nat.tracker, nat.usage) == (py.end, py.tracker, py.usage)
    assert (nat.gaps, nat.reusable, nat.unit_aborted) == (py.gaps, py.reusable, py.unit_aborted)
    assert nat.ended == py.ended
    if py.ended:  # only a clean end ends the client's stream
        assert py.end == "complete" and py.tracker.get("done", True)
        assert py.writes[-1].endswith(b"0\r\n\r\n")


@pytest.mark.parametrize(("name", "body", "opts"), RECORDED, ids=[r[0] for r in RECORDED])
def test_the_tap_reads_as_the_connection_would(
    name: str, body: bytes, opts: dict[str, Any]
) -> None:
    """The compiled Tap (the protocol the pool connects with) hands each read to the Reader
    itself: what it does must be what the connection's own data_received does, read for read
    (each event its own read, then the same bytes in reads of 97 bytes)."""
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    per_event = [CHUNKED + b"%x\r\n%b\r\n" % (len(events[0]), events[0])]
    per_event += [b"%x\r\n%b\r\n" % (len(e), e) for e in events[1:]] + [b"0\r\n\r\n"]
    whole = b"".join(per_event)
    for reads in (per_event, split(whole, list(range(97, len(whole), 97)))):
        for tracked in (True, False):
            tap = relay_reads(native(), reads, tracked=tracked, **opts)
            own = relay_reads(native(), reads, tracked=tracked, tap=False, **opts)
            assert_same(own, tap, pumps=("NativePump", "NativePump"))


def test_the_recorded_corpus_covers_all_three_servers() -> None:
    names = [name for name, _, _ in RECORDED]
    assert any(n.startswith("builtin_") for n in names)
    assert any(n.startswith("sim_") for n in names)
    assert sum(1 for n in names if "stream" in n and not n.startswith(("sim_", "builtin_"))) >= 5


@pytest.mark.parametrize(("name", "body", "opts"), RECORDED, ids=[r[0] for r in RECORDED])
def test_recorded_stream_event_per_read(name: str, body: bytes, opts: dict[str, Any]) -> None:
    """Each event its own chunk and read, as a unit streaming in real time sends them."""
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    reads = [CHUNKED + chunked(events[0], [len(events[0])])[:-5]]
    reads += [b"%x\r\n%b\r\n" % (len(e), e) for e in events[1:]] + [b"0\r\n\r\n"]
    for tracked in (True, False):
        for lean in (False, True):
            py, nat = both(reads, tracked=tracked, lean=lean, **opts)
            assert_same(py, nat)
            if lean:
                assert py.writes[0].startswith(CLIENT_HEAD)  # with the first bytes, not alone
                assert py.writes[0] != CLIENT_HEAD
                # a tracked stream that stops short of its end is not ended: it resumes
                assert py.ended == (py.end == "complete" and py.tracker.get("done", True))
        assert py.end == "complete" or "drop" in name or "error" in name, py.end
        assert py.writes  # the relay wrote, not only the first bytes


TRACKED = [r for r in RECORDED if b',"token_ids":[' in r[1]]


@pytest.mark.parametrize(("name", "body", "opts"), TRACKED, ids=[r[0] for r in TRACKED])
def test_a_recorded_answer_needs_no_python_tracker(
    monkeypatch: pytest.MonkeyPatch, name: str, body: bytes, opts: dict[str, Any]
) -> None:
    """The native relay calls the Python tracker for nothing the servers send: the first event
    (its prompt ids), token chunks, the finish chunk, the usage chunk and [DONE] are read in
    C; an error event, which breaks the stream, goes to Python."""
    from gateway.relay.tracker import StreamTracker

    called: list[bytes] = []
    event = StreamTracker._event

    def counting(self: StreamTracker, data: bytes) -> bytes:
        called.append(data)
        return event(self, data)

    monkeypatch.setattr(StreamTracker, "_event", counting)
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    reads = [CHUNKED + b"%x\r\n%b\r\n" % (len(e), e) for e in events[:1]]
    reads += [b"%x\r\n%b\r\n" % (len(e), e) for e in events[1:]] + [b"0\r\n\r\n"]
    for client_ids in (False, True):
        called.clear()
        out = relay_reads(native(), reads, **{**opts, "client_ids": client_ids})
        assert out.pump == "NativePump" and out.tracker["capable"]
        errors = [e for e in events if b'"error"' in e]
        assert called == errors[:1], called
        if not errors and b"data: [DONE]" in body:  # (one recording is cut off before its end)
            assert out.end == "complete" and out.tracker["done"] and out.tracker["finish_reason"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, len(RECORDED) - 1),
    sizes=st.lists(st.integers(1, 700), min_size=1, max_size=8),
    cuts=st.lists(st.integers(0, 40_000), max_size=40),
    tracked=st.booleans(),
    client_ids=st.booleans(),
    lean=st.booleans(),
)
def test_recorded_stream_split_anywhere(
    which: int, sizes: list[int], cuts: list[int], tracked: bool, client_ids: bool, lean: bool
) -> None:
    _, body, opts = RECORDED[which]
    opts = {**opts, "client_ids": client_ids}
    reads = split(CHUNKED + chunked(body, sizes), cuts)
    py, nat = both(reads, tracked=tracked, lean=lean, **opts)
    assert_same(py, nat)


# -- generated streams ----------------------------------------------------------------------

TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=6
)
IDS = st.lists(st.integers(0, 60_000), min_size=0, max_size=3)


def _chunk(
    shape: str,
    chat: bool,
    text: str | None,
    ids: list[int],
    finish: str | None,
    stop: str = "null",
) -> bytes:
    """One token chunk in the key order of the server `shape` names (`text` None: a chat
    finish chunk's empty delta; `stop`: vLLM's stop_reason, as JSON)."""
    head = '{"id":"c1","object":"chat.completion.chunk","created":1,"model":"served",'
    if chat:
        content = "" if text is None else '"content":' + orjson.dumps(text).decode()
        choice = '"index":0,"delta":{' + content + "}"
    else:
        choice = '"index":0,"text":' + orjson.dumps(text or "").decode()
    fin = orjson.dumps(finish).decode()
    listed = orjson.dumps(ids).decode()
    if shape == "builtin":
        body = f'{choice},"logprobs":null,"finish_reason":{fin},"token_ids":{listed}}}]}}'
    elif shape == "builtin_usage":
        body = (
            f'{choice},"logprobs":null,"finish_reason":{fin},"token_ids":{listed}}}],"usage":null}}'
        )
    elif shape == "vllm_chat":  # a stop_reason, no prompt ids
        body = (
            f'{choice},"logprobs":null,"finish_reason":{fin},"stop_reason":{stop},'
            f'"token_ids":{listed}}}]}}'
        )
    else:  # vLLM's completions order
        body = (
            f'{choice},"logprobs":null,"finish_reason":{fin},"stop_reason":{stop},'
            f'"prompt_token_ids":null,"token_ids":{listed}}}]}}'
        )
    return ("data: " + head + '"choices":[{' + body + "\n\n").encode()


# Finish reasons: the common words, and what must not be read as one without parsing.
FINISH = st.sampled_from(
    [None, None, None, "stop", "length", "tool_calls", "Stop", "", 'st"op', "x" * 33]
)
STOP = st.sampled_from(["null", "null", '"\\n"', "7"])
USAGE = '{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}'
USAGE_CHUNKS = st.sampled_from(
    [
        f'data: {{"id":"c1","choices":[],"usage":{USAGE}}}\n\n',
        f'data: {{"id":"c1","choices":[],"usage":{USAGE},"system_fingerprint":"v"}}\n\n',
        # vLLM's with --enable-prompt-tokens-details
        'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":300,"total_tokens":303,'
        '"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":256}}}\n\n',
        f'data: {{"id":"c1","choices":[],"usage":{USAGE},"error":"late"}}\n\n',
        f'data: {{"id":"c1","choices":[],"usage":{USAGE},"prompt_token_ids":[1]}}\n\n',
        f'data: {{"id":"c1","choices":[],"choices":[],"usage":{USAGE}}}\n\n',
        # a choice with text, and another object's empty choices
        'data: {"id":"c1","choices":[{"index":0,"text":"a","delta":{"content":"a"},'
        f'"finish_reason":null,"x":{{"choices":[]}}}}],"usage":{USAGE}}}\n\n',
    ]
).map(str.encode)


# The prompt's ids as units might list them: what the native relay reads itself (ints that fit
# in 32 bits, compact), and what it leaves to the parser (which then decides as it would).
PROMPT_IDS = st.one_of(
    st.lists(st.integers(0, 99), min_size=1, max_size=4).map(
        lambda ids: orjson.dumps(ids).decode()
    ),
    st.sampled_from(["[]", "[01]", "[-3,2]", "[2147483648]", "[-2147483648]", "[1.0]", "[1, 2]"]),
)


@st.composite
def opening_event(draw: st.DrawFn, chat: bool) -> bytes:
    """An answer's first event, with its prompt's ids: at the top level after the role chunk
    (chat), or in the one choice with the first token's (completions, both servers' orders);
    now and then written as orjson would not (a space, an escape)."""
    prompt = draw(PROMPT_IDS)
    head = '{"id":"c1","object":"chat.completion.chunk","created":1,"model":"served",'
    if chat or draw(st.booleans()):
        role = '"delta":{"role":"assistant","content":""}' if chat else '"text":""'
        body = (
            f'"choices":[{{"index":0,{role},"logprobs":null,"finish_reason":null}}],'
            f'"prompt_token_ids":{prompt}}}'
        )
    elif draw(st.booleans()):  # the builtin engine's completions order
        body = (
            '"choices":[{"index":0,"text":" Paris","logprobs":null,"finish_reason":null,'
            f'"token_ids":[7042],"prompt_token_ids":{prompt}}}],"usage":null}}'
        )
    else:  # vLLM's
        body = (
            '"choices":[{"index":0,"text":" Paris","logprobs":null,"finish_reason":null,'
            f'"stop_reason":null,"prompt_token_ids":{prompt},"token_ids":[7042]}}]}}'
        )
    event = head + body
    style = draw(st.sampled_from(["compact", "compact", "compact", "space", "escape"]))
    if style == "space":
        event = event.replace('"created":1', '"created": 1')
    elif style == "escape":
        event = event.replace('"id":"c1"', '"id":"c\\u00e91"')
    return ("data: " + event + "\n\n").encode()


@st.composite
def events(draw: st.DrawFn, chat: bool) -> list[bytes]:
    opening = draw(opening_event(chat))
    out = [opening]
    shapes = st.sampled_from(["builtin", "builtin_usage", "vllm", "vllm_chat"])
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.integers(0, 20))
        if kind <= 14:
            finish = draw(FINISH)
            text = draw(st.one_of(st.none(), TEXT) if finish is not None else TEXT)
            out.append(_chunk(draw(shapes), chat, text, draw(IDS), finish, draw(STOP)))
        elif kind == 15:
            out.append(b": keep-alive\n\n")
        elif kind == 16:
            event = _chunk("builtin", chat, draw(TEXT), draw(IDS), None)
            out.append(event[:-2] + b"\r\n\r\n")
        elif kind == 17:
            out.append(b'data: {"error":{"message":"boom","code":"engine_error"}}\n\n')
        elif kind == 18:
            out.append(draw(USAGE_CHUNKS))
        elif kind == 19:
            out.append(b"data: not json\n\n")
        else:
            out.append(b"data: [DONE]\n\n")
    if draw(st.booleans()):
        out.append(b"data: [DONE]\n\n")
    return out


@st.composite
def framed(draw: st.DrawFn, body: bytes) -> bytes:
    how = draw(st.sampled_from(["chunked", "chunked", "length", "close"]))
    if how == "chunked":
        sizes = draw(st.lists(st.integers(1, 300), min_size=1, max_size=6))
        trailer = draw(st.sampled_from([b"", b"x-trailer: 1\r\n"]))
        whole = chunked(body, sizes)
        return CHUNKED + whole[:-2] + trailer + b"\r\n"
    if how == "length":
        return SSE_HEAD + b"content-length: %d\r\n\r\n%b" % (len(body), body)
    return SSE_HEAD + b"connection: close\r\n\r\n" + body


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), chat=st.booleans(), client_ids=st.booleans(), usage=st.booleans())
def test_generated_streams(data: st.DataObject, chat: bool, client_ids: bool, usage: bool) -> None:
    body = b"".join(data.draw(events(chat)))
    raw = data.draw(framed(body))
    reads = split(raw, data.draw(st.lists(st.integers(0, len(raw)), max_size=30)))
    tracked = data.draw(st.booleans())
    served = data.draw(st.sampled_from([None, None, "served"]))
    opts = {"chat": chat, "client_ids": client_ids, "include_usage": usage}
    opts["reads_usage"] = data.draw(st.booleans())  # the gateway asked for the usage chunk
    py, nat = both(reads, tracked=tracked, served=served, lean=data.draw(st.booleans()), **opts)
    assert_same(py, nat)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), chat=st.booleans(), client_ids=st.booleans(), usage=st.booleans())
def test_the_shapes_read_without_parsing_read_as_the_parser_does(
    data: st.DataObject, chat: bool, client_ids: bool, usage: bool
) -> None:
    """Both relays read the common events without the JSON parser (the tracker's
    `_known_shape`, and its copy in C): over generated streams, what that gives the client and
    leaves in the tracker is what parsing every event gives."""
    from gateway.relay.tracker import StreamTracker

    class Parsing(StreamTracker):
        __slots__ = ()

        def _known_shape(self, event: bytes) -> bytes | None:
            return None

    events_ = data.draw(events(chat))

    def run(shapes: bool) -> tuple[object, ...]:
        tracker = (StreamTracker if shapes else Parsing)(chat, client_ids, usage)
        out = b"".join(tracker.feed(e) for e in events_)
        try:
            ids: object = tracker.generated
        except ValueError:
            ids = "not integers"
        state = (tracker.committed, tracker.produced, tracker.finish_reason, tracker.done)
        return out, ids, *state, tracker.error, tracker.capable

    assert run(True) == run(False)


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    after=st.integers(0, 6),
    buffered=st.sampled_from([0, 10**6]),
    lean=st.booleans(),
)
def test_a_client_that_leaves_or_reads_slowly(
    data: st.DataObject, after: int, buffered: int, lean: bool
) -> None:
    """The client closing after some writes, or a full send buffer: both relays stop alike."""
    body = b"".join(data.draw(events(True)))
    raw = CHUNKED + chunked(body, [40])
    reads = split(raw, data.draw(st.lists(st.integers(0, len(raw)), max_size=20)))
    py = relay_reads(None, reads, client=ClientSide(after, buffered), lean=lean)
    nat = relay_reads(native(), reads, client=ClientSide(after, buffered), lean=lean)
    assert_same(py, nat)


def test_only_events_that_name_a_usage_reach_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenAI's `"usage": null` on every chunk before the last is not parsed, on either relay:
    a plain stream asked for its usage costs no Python per token."""
    from gateway.relay.usage import UsageReader

    parsed: list[bytes] = []
    event = UsageReader._event

    def counting(self: UsageReader, data: bytes) -> None:
        parsed.append(data)
        event(self, data)

    monkeypatch.setattr(UsageReader, "_event", counting)
    tokens = [
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"%d"}}],"usage":null}\n\n' % i
        for i in range(5)
    ]
    spaced = b'data: {"id":"c","choices":[],"usage" :\tnull}\n\n'
    last = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}\n\n'
    body = b"".join([*tokens, spaced, last, b"data: [DONE]\n\n"])
    for relay in (None, native()):
        parsed.clear()
        out = relay_reads(relay, split(CHUNKED + chunked(body, [40]), [90, 200]), tracked=False)
        assert out.usage[:2] == (3, 5)
        assert parsed == [last], relay


def test_a_stream_cut_off_mid_answer_leaves_the_trackers_counts_as_python_does() -> None:
    """The native relay keeps the tracker's counts between reads and writes them back when
    Python looks: here the unit's connection closes after a few token chunks, with no flag
    from any read, and resumption reads the counts from the tracker."""
    name, body, opts = next(r for r in RECORDED if r[0].startswith("sim_") and r[2]["chat"])
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e][:6]
    reads = [CHUNKED + b"%x\r\n%b\r\n" % (len(events[0]), events[0])]
    reads += [b"%x\r\n%b\r\n" % (len(e), e) for e in events[1:]]  # no last chunk: cut off
    for lean in (False, True):
        py, nat = both(reads, lean=lean, **opts)
        assert_same(py, nat)
        assert py.end == "broken" and py.tracker["produced"] >= 4, (name, py.end, py.tracker)
