"""StreamTracker: what the client sees of a resumable stream, and what resumption learns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.proxy.continuation import (
    asking_usage,
    carried,
    continuation,
    max_new_tokens,
    resumable,
    with_token_ids,
)
from gateway.relay.sse import EventSplitter, data_of
from gateway.relay.tracker import StreamTracker

pytestmark = pytest.mark.both_relays

BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m"}
PROMPT = [5, 6, 7]


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chat_chunk(
    content: str | None, ids: list[int] | None, finish: str | None = None, **top: Any
) -> bytes:
    delta: dict[str, Any] = {} if content is None else {"content": content}
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return sse({**BASE, "system_fingerprint": None, **top, "choices": [choice]})


def role_chunk(with_ids: bool) -> bytes:
    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}}
    choice |= {"logprobs": None, "finish_reason": None}
    body: dict[str, Any] = {**BASE, "system_fingerprint": None, "choices": [choice]}
    if with_ids:
        body["prompt_token_ids"] = PROMPT
    return sse(body)


def engine_stream(with_ids: bool, tokens: list[tuple[int, str]], finish: str) -> list[bytes]:
    """Chunks as the builtin engine writes them (engine/server/wire.py): with ids, a chunk for
    every token (empty text included); without, only tokens with text."""
    events = [role_chunk(with_ids)]
    for token, text in tokens:
        if text or with_ids:
            events.append(chat_chunk(text, [token] if with_ids else None))
    events.append(chat_chunk(None, [] if with_ids else None, finish))
    return [*events, b"data: [DONE]\n\n"]


TOKENS = [(10, "Hel"), (11, "lo"), (12, ""), (13, "!"), (14, " ok")]


def test_stripping_token_ids_gives_the_bytes_of_a_plain_stream() -> None:
    tracker = StreamTracker(chat=True, client_ids=False, include_usage=False)
    asked = b"".join(engine_stream(True, TOKENS, "stop"))
    plain = b"".join(engine_stream(False, TOKENS, "stop"))
    # Fed in awkward pieces: events split anywhere must come out whole.
    out = b"".join(tracker.feed(asked[i : i + 7]) for i in range(0, len(asked), 7))
    assert out == plain
    assert tracker.done and tracker.capable and tracker.prompt_ids is not None
    assert tracker.prompt_ids.tolist() == PROMPT  # kept packed: 4 bytes a token
    assert tracker.generated == [10, 11, 12, 13, 14] and tracker.committed == 5


def test_a_client_that_asked_for_token_ids_gets_them_verbatim() -> None:
    tracker = StreamTracker(chat=True, client_ids=True, include_usage=False)
    asked = b"".join(engine_stream(True, TOKENS, "stop"))
    assert tracker.feed(asked) == asked


def test_ids_are_parsed_only_when_asked_for_and_keep_their_order() -> None:
    """The fast path keeps each event's ids as bytes; a chunk the parsing path takes (here one
    with its ids before its finish reason) lands after them, and a multi-id chunk counts each
    id."""

    def reordered(ids: list[int]) -> bytes:
        choice = {"index": 0, "delta": {"content": ""}, "token_ids": ids, "finish_reason": "length"}
        return sse({**BASE, "system_fingerprint": None, "choices": [choice]})

    tracker = StreamTracker(chat=True, client_ids=False, include_usage=False)
    tracker.feed(role_chunk(True))
    tracker.feed(chat_chunk("a", [10]) + chat_chunk("b", [11, 12]))
    tracker.feed(chat_chunk("c", [13]))
    assert tracker.unparsed and tracker.produced == 4 and tracker.committed == 4
    tracker.feed(reordered([14]))  # parsed: the fast path knows no such key order
    assert tracker.unparsed and tracker.produced == 5  # its ids join the unparsed ones
    assert tracker.generated == [10, 11, 12, 13, 14] and not tracker.unparsed
    tracker.feed(reordered([15, 16]))  # with none unparsed: parsed ids
    assert not tracker.unparsed and tracker.generated == [10, 11, 12, 13, 14, 15, 16]
    assert tracker.resume_point() == [*PROMPT, 10, 11, 12, 13]


def test_ids_that_are_not_integers_make_a_stream_unresumable() -> None:
    """Found only once resumption parses them: the stream then ends as if the unit gave no
    ids (never a crash mid-relay)."""
    tracker = StreamTracker(chat=True, client_ids=False, include_usage=False)
    tracker.feed(role_chunk(True))
    bad = chat_chunk("a", [10]).replace(b"[10]", b"[10,x]")
    assert tracker.feed(bad) == chat_chunk("a", None)
    assert tracker.resume_point() is None


def test_held_back_tokens_are_not_committed() -> None:
    """A token whose text the engine still holds (half a character) is generated again."""
    tracker = StreamTracker(chat=True, client_ids=False, include_usage=False)
    events = engine_stream(True, TOKENS, "stop")
    tracker.feed(b"".join(events[:4]))  # role, "Hel", "lo", "" (held back)
    assert tracker.generated == [10, 11, 12] and tracker.committed == 2
    assert tracker.resume_point() == [*PROMPT, 10, 11]


def test_a_partial_event_is_never_relayed_and_is_dropped_on_resume() -> None:
    tracker = StreamTracker(chat=True, client_ids=False, include_usage=False)
    events = engine_stream(True, TOKENS, "stop")
    head = b"".join(events[:2])
    assert tracker.feed(head + events[2][:10]) == b"".join(engine_stream(False, TOKENS, "")[:2])
    tracker.begin_continuation()
    assert tracker.splitter.pending == 0 and tracker.committed == 1


def continuation_chunk(text: str, ids: list[int], finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    choice["token_ids"] = ids
    return sse(
        {
            "id": "cmpl-9",
            "object": "text_completion",
            "created": 99,
            "model": "m",
            "choices": [choice],
        }
    )


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_continuation_is_spliced_in_the_original_shape(include_usage: bool) -> None:
    tracker = StreamTracker(chat=True, client_ids=False, include_usage=include_usage)
    events = engine_stream(True, TOKENS, "stop")
    tracker.feed(b"".join(events[:3]))  # role, "Hel", "lo"; then the unit dies
    assert tracker.resume_point() == [*PROMPT, 10, 11]
    tracker.begin_continuation()
    usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    tail = [
        continuation_chunk("", [12]),  # held back again by the new unit: no client chunk
        continuation_chunk("!", [13]),
        continuation_chunk(" ok", [14]),
        continuation_chunk("", [], "stop"),
        sse({"id": "cmpl-9", "object": "text_completion", "created": 99, "model": "m",
             "choices": [], "usage": usage}),
        b"data: [DONE]\n\n",
    ]  # fmt: skip
    out = tracker.feed(b"".join(tail))
    chunks = [orjson.loads(data_of(e) or b"") for e in EventSplitter().feed(out)[:-1]]
    texts = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert texts == ["!", " ok", None]
    for chunk in chunks:
        assert {k: chunk[k] for k in BASE} == BASE  # same id, object, created, model
        for choice in chunk["choices"]:
            assert "role" not in choice["delta"] and "token_ids" not in choice
    assert chunks[len(texts) - 1]["choices"][0]["finish_reason"] == "stop"
    if include_usage:
        # The whole answer once: 2 tokens before the break + 3 from the continuation.
        assert chunks[-1]["usage"] == {
            "prompt_tokens": 3,
            "completion_tokens": 5,
            "total_tokens": 8,
        }
    else:
        assert all("usage" not in c for c in chunks)
    assert out.endswith(b"data: [DONE]\n\n") and tracker.done


def test_an_error_event_is_held_back_for_the_gateway() -> None:
    tracker = StreamTracker(chat=True, client_ids=False, include_usage=False)
    events = engine_stream(True, TOKENS, "stop")
    error = sse({"error": {"message": "engine unhealthy: follower lost", "type": "server_error"}})
    out = tracker.feed(b"".join(events[:2]) + error)
    assert b"error" not in out and tracker.error == "engine unhealthy: follower lost"


def test_units_without_token_ids_are_relayed_verbatim_and_not_resumable() -> None:
    tracker = StreamTracker(chat=True, client_ids=False, include_usage=False)
    plain = b"".join(engine_stream(False, TOKENS, "stop"))
    assert tracker.feed(plain) == plain
    assert tracker.capable is False and tracker.resume_point() is None


def test_prompt_ids_past_32_bits_are_no_ids_and_the_stream_is_relayed_as_it_is() -> None:
    """Prompt ids are kept as 32-bit integers (a long prompt's list of ints would cost 36
    bytes a token for the stream's life); no tokenizer has 2**31 tokens, so a unit sending
    such an id is one whose ids cannot be used: relayed verbatim, never resumed."""
    tracker = StreamTracker(chat=True, client_ids=True, include_usage=False)
    body = orjson.loads(data_of(role_chunk(True)) or b"")
    body["prompt_token_ids"] = [5, 2**31]
    events = [sse(body), chat_chunk("hi", [10]), b"data: [DONE]\n\n"]
    assert b"".join(tracker.feed(e) for e in events) == b"".join(events)
    assert tracker.capable is False and tracker.resume_point() is None


def test_a_non_openai_stream_passes_through() -> None:
    tracker = StreamTracker(chat=True, client_ids=False, include_usage=False)
    raw = b"data: one\n\n: comment\n\ndata: [DONE]\n\n"
    assert tracker.feed(raw) == raw and tracker.done


def test_closing_an_answer_whose_last_token_was_relayed() -> None:
    tracker = StreamTracker(chat=True, client_ids=False, include_usage=True)
    tracker.feed(b"".join(engine_stream(True, TOKENS, "stop")[:6]))
    out = tracker.closing("length")
    events = [orjson.loads(data_of(e) or b"") for e in EventSplitter().feed(out)[:-1]]
    finish = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    assert events[0]["choices"] == [finish]
    assert events[1]["usage"]["completion_tokens"] == 5
    assert out.endswith(b"data: [DONE]\n\n")


# -- resume policy and the continuation request ---------------------------------------------


def test_what_can_be_resumed() -> None:
    chat = {"model": "m", "messages": [], "stream": True}
    assert resumable(chat, chat=True)
    assert not resumable({**chat, "stream": False}, chat=True)
    assert not resumable({**chat, "n": 2}, chat=True)
    assert resumable({**chat, "n": None}, chat=True) and resumable({**chat, "n": 1}, chat=True)
    assert not resumable({**chat, "tools": [{"type": "function"}]}, chat=True)
    assert not resumable({**chat, "logprobs": True}, chat=True)
    assert resumable({**chat, "logprobs": False}, chat=True)
    completion = {"model": "m", "stream": True}
    assert resumable({**completion, "prompt": "hi"}, chat=False)
    assert resumable({**completion, "prompt": [1, 2]}, chat=False)
    assert not resumable({**completion, "prompt": ["a", "b"]}, chat=False)
    assert not resumable({**completion, "prompt": "hi", "echo": True}, chat=False)


def test_the_continuation_request() -> None:
    data = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
        "max_tokens": 10,
        "temperature": 0.0,
        "stop": ["\n\n"],
        "min_tokens": 4,
        "parallel_tool_calls": False,  # chat-only: must not reach /v1/completions
        "stream_options": {"include_usage": False},
    }
    assert orjson.loads(with_token_ids(data))["return_token_ids"] is True
    assert max_new_tokens(data, chat=True) == 10
    assert max_new_tokens({"model": "m"}, chat=True) is None
    assert max_new_tokens({"model": "m"}, chat=False) == 16
    # What a resumable stream keeps of its request: no messages (the prompt ids stand for
    # them), and everything a continuation reads.
    kept = carried(data)
    assert kept == {"max_tokens": 10, "temperature": 0.0, "stop": ["\n\n"], "min_tokens": 4}
    assert max_new_tokens(kept, chat=True) == 10
    assert continuation(kept, "m", [1, 2, 3], 7, 3) == continuation(data, "m", [1, 2, 3], 7, 3)
    body = orjson.loads(continuation(kept, "m", [1, 2, 3], 7, 3))
    assert body == {
        "model": "m",
        "prompt": [1, 2, 3],
        "temperature": 0.0,
        "stop": ["\n\n"],
        "min_tokens": 1,
        "max_tokens": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }


@pytest.mark.parametrize("client_ids", [False, True])
@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("reads", ["50 bytes", "one event", "three events"])
def test_the_unparsed_fast_path_agrees_with_parsing(
    monkeypatch: pytest.MonkeyPatch, client_ids: bool, include_usage: bool, reads: str
) -> None:
    """Token chunks skip the JSON parser; the parser must reach the same bytes and state,
    however the stream is cut into reads."""
    extra = {"usage": None} if include_usage else {}
    events = [role_chunk(True)]
    for token, text in [*TOKENS, (15, "x"), (16, "y"), (17, "z")]:
        events.append(chat_chunk(text, [token], **extra))
    events += [chat_chunk(None, [], "stop", **extra), b"data: [DONE]\n\n"]
    stream = b"".join(events)
    if reads == "50 bytes":
        pieces = [stream[i : i + 50] for i in range(0, len(stream), 50)]
    else:
        size = 1 if reads == "one event" else 3
        pieces = [b"".join(events[i : i + size]) for i in range(0, len(events), size)]

    def run() -> tuple[bytes, list[int], int, str | None, bool]:
        tracker = StreamTracker(chat=True, client_ids=client_ids, include_usage=include_usage)
        out = b"".join(tracker.feed(piece) for piece in pieces)
        return out, tracker.generated, tracker.committed, tracker.finish_reason, tracker.done

    fast = run()
    monkeypatch.setattr(StreamTracker, "_known_shape", lambda self, event: None)
    assert run() == fast


@pytest.mark.parametrize(
    "name", ["completions_stream_token_ids.sse", "completions_stream_token_ids_prompt_ids.sse"]
)
@pytest.mark.parametrize("client_ids", [False, True])
def test_vllm_completion_chunks_take_the_fast_path_to_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch, name: str, client_ids: bool
) -> None:
    """vLLM's completion chunks (a null stop_reason and null prompt ids between the finish
    reason and the ids) are read without parsing, to the bytes and state parsing reaches."""
    stream = (Path(__file__).parents[2] / "data" / "vllm" / name).read_bytes()
    taken = []
    original = StreamTracker._known_shape

    def spy(self: StreamTracker, event: bytes) -> bytes | None:
        out = original(self, event)
        taken.append(out is not None)
        return out

    def run() -> tuple[bytes, list[int], int, int, str | None]:
        tracker = StreamTracker(chat=False, client_ids=client_ids, include_usage=True)
        out = b"".join(tracker.feed(e + b"\n\n") for e in stream.split(b"\n\n") if e)
        return out, tracker.generated, tracker.committed, tracker.produced, tracker.finish_reason

    monkeypatch.setattr(StreamTracker, "_known_shape", spy)
    fast = run()
    assert sum(taken) >= 10  # the token chunks took the fast path
    monkeypatch.setattr(StreamTracker, "_known_shape", lambda self, event: None)
    assert run() == fast


def _recorded_streams() -> list[tuple[str, bytes, dict[str, bool]]]:
    """The recorded answers of the builtin engine, the simulated units and stock vLLM that
    carry token ids, with the options they were recorded with."""
    data = Path(__file__).parents[2] / "data"
    out = []
    for entry in orjson.loads((data / "streams" / "index.json").read_bytes()):
        opts = {k: entry[k] for k in ("chat", "client_ids", "include_usage")}
        out.append((entry["file"], (data / "streams" / entry["file"]).read_bytes(), opts))
    for path in sorted((data / "vllm").glob("*.sse")):
        if b',"token_ids":[' not in path.read_bytes():
            continue  # asked for no ids (or another API): relayed verbatim, never tracked
        opts = {"chat": path.name.startswith(("chat", "multinode")), "client_ids": False}
        out.append((path.name, path.read_bytes(), {**opts, "include_usage": True}))
    return out


RECORDED = _recorded_streams()


@pytest.mark.parametrize(("name", "body", "opts"), RECORDED, ids=[r[0] for r in RECORDED])
def test_only_an_answers_first_event_is_parsed(
    monkeypatch: pytest.MonkeyPatch, name: str, body: bytes, opts: dict[str, bool]
) -> None:
    """Every later event the servers send (token chunks, the finish chunk, the usage chunk,
    [DONE]) is read without the JSON parser, to the bytes and state parsing reaches."""
    parsed: list[bytes] = []
    original = StreamTracker._original

    def spy(self: StreamTracker, obj: dict[str, Any], event: bytes) -> bytes:
        parsed.append(event)
        return original(self, obj, event)

    def run() -> tuple[bytes, list[int], int, int, str | None, bool, str | None]:
        parsed.clear()
        tracker = StreamTracker(**opts)
        out = b"".join(tracker.feed(e + b"\n\n") for e in body.split(b"\n\n") if e)
        state = (tracker.committed, tracker.produced, tracker.finish_reason, tracker.done)
        return out, tracker.generated, *state, tracker.error

    monkeypatch.setattr(StreamTracker, "_original", spy)
    fast = run()
    assert len(parsed) == 1, parsed[1:]
    monkeypatch.setattr(StreamTracker, "_known_shape", lambda self, event: None)
    assert run() == fast
    assert len(parsed) > 1  # the parsing path did read the rest this time


@pytest.mark.parametrize(
    ("before", "why"),
    [
        (b'"finish_reason":"Stop"', "not a lowercase word"),
        (b'"finish_reason":"st\\u006fp"', "an escape"),
        (b'"finish_reason":""', "empty"),
        (b'"finish_reason":"' + b"x" * 33 + b'"', "longer than 32"),
        (b'"finish_reason":"stop","stop_reason":"\\n"', "a stop string"),
        (b'"finish_reason":"stop","stop_reason":7', "a stop token"),
        (b'"reason":"stop"', "another key"),
    ],
)
def test_a_finish_chunk_of_another_shape_is_parsed(before: bytes, why: str) -> None:
    """Only a plain-word finish reason, with at most vLLM's null stop_reason and null prompt
    ids after it, is read without parsing; the parsing path reads the rest the same way."""
    event = b'data: {"id":"c","choices":[{"index":0,"text":"a","logprobs":null,%b' % before
    event += b',"token_ids":[9]}]}\n\n'
    tracker = StreamTracker(chat=False, client_ids=False, include_usage=False)
    tracker.capable = True
    tracker.template = {"id": "c"}
    assert tracker._known_shape(event) is None, why
    out = tracker._event(event)
    assert tracker.generated == [9] and b"token_ids" not in out, why


USAGE = b'"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}'


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (b'data: {"id":"c","choices":[],%b,"error":"late"}\n\n' % USAGE, "an error"),
        (b'data: {"id":"c","choices":[],%b,"prompt_token_ids":[1]}\n\n' % USAGE, "prompt ids"),
        (
            b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"},"x":{"choices":[]}'
            b"}],%b}\n\n" % USAGE,
            "a choice, and another object's empty choices",
        ),
        (b'data: {"id":"c","choices":[],"usage":null}\n\n', "no usage"),
    ],
)
def test_a_usage_chunk_of_another_shape_is_parsed(event: bytes, why: str) -> None:
    tracker = StreamTracker(chat=True, client_ids=False, include_usage=True)
    tracker.capable = True
    tracker.template = {"id": "c"}
    assert tracker._known_shape(event) is None, why
    tracker._event(event)  # the parsing path reads it, and does not fail


def test_a_usage_chunk_is_relayed_as_it_came() -> None:
    event = b'data: {"id":"c","choices":[],%b,"system_fingerprint":"v"}\n\n' % USAGE
    tracker = StreamTracker(chat=True, client_ids=False, include_usage=True)
    tracker.capable = True
    tracker.template = {"id": "c"}
    assert tracker._known_shape(event) == event == tracker._event(event)


USAGE_CHUNK = sse(
    {
        **BASE,
        "choices": [],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 5,
            "total_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 2},
        },
    }
)


@pytest.mark.parametrize("client_asked", [False, True])
def test_the_usage_chunk_the_gateway_asked_for_is_read_and_shown_only_if_the_client_asked(
    client_asked: bool,
) -> None:
    """The gateway asks for the usage chunk where it predicted the prompt's cached tokens:
    it reads the unit's count, and the client sees the chunk, details and all, only if it
    asked for usage itself."""
    tracker = StreamTracker(True, False, include_usage=client_asked, reads_usage=True)
    stream = engine_stream(True, TOKENS, "stop")
    stream.insert(-1, USAGE_CHUNK)
    out = b"".join(tracker.feed(event) for event in stream)
    plain = engine_stream(False, TOKENS, "stop")
    if client_asked:
        plain.insert(-1, USAGE_CHUNK)
    assert out == b"".join(plain)
    assert tracker.cached == 2 and tracker.done


def test_a_usage_chunk_the_gateway_did_not_ask_for_is_relayed_unread() -> None:
    tracker = StreamTracker(True, False, include_usage=True)
    assert tracker.feed(role_chunk(True)) and tracker.feed(USAGE_CHUNK) == USAGE_CHUNK
    assert tracker.cached is None


def test_asking_for_usage_splices_the_member_or_merges_the_clients_options() -> None:
    body = b'{"model":"m","stream":true,"messages":[]}'
    sent = asking_usage(body, orjson.loads(body))
    assert sent.endswith(body[1:])  # the client's bytes kept, the member spliced in first
    assert orjson.loads(sent)["stream_options"] == {"include_usage": True}
    theirs = b'{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":false}}'
    merged = orjson.loads(asking_usage(theirs, orjson.loads(theirs)))
    assert merged["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
