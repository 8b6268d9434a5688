"""Property tests of request validation, in process (fast, many examples).

For any bytes at all, parsing plus validation either accepts the body with sane routing keys or
raises InvalidRequest answered as an OpenAI-shaped 4xx: never another exception (a 500).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidRequest
from gateway.proxy.validation import (
    RequestInfo,
    Served,
    parse_body,
    validate_chat,
    validate_completion,
)
from tests.fuzz.strategies import FUZZ, JSON, hostile_body, mutated_chat, nested, valid_chat
from tests.support import MODEL

MODELS = Served.of([MODEL])
PREFIX = 256
VALIDATORS = [validate_chat, validate_completion]


def judge(body: bytes, validate: Any, prefix_chars: int = PREFIX) -> RequestInfo | InvalidRequest:
    """Parse and validate; only InvalidRequest may escape, and its answer must be well formed."""
    try:
        info: RequestInfo = validate(parse_body(body), MODELS, prefix_chars)
        return info
    except InvalidRequest as exc:
        assert exc.status in (400, 404), exc.status
        answer = exc.response().body
        assert isinstance(answer, bytes)
        error = orjson.loads(answer)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error" and error["message"]
        return exc


def check_info(info: RequestInfo, prefix_chars: int = PREFIX) -> None:
    assert info.model == MODEL
    assert isinstance(info.stream, bool)
    assert info.user is None or isinstance(info.user, str)
    assert isinstance(info.prefix, str) and len(info.prefix) <= prefix_chars
    info.prefix.encode()  # a key the affinity hash can encode: no lone surrogates


@settings(FUZZ, max_examples=400)
@given(body=st.binary(max_size=300), which=st.sampled_from(VALIDATORS))
def test_arbitrary_bytes_are_accepted_or_refused_4xx(body: bytes, which: Any) -> None:
    result = judge(body, which)
    if isinstance(result, RequestInfo):
        check_info(result)


@settings(FUZZ, max_examples=400)
@given(value=JSON, which=st.sampled_from(VALIDATORS))
def test_arbitrary_json_is_accepted_or_refused_4xx(value: Any, which: Any) -> None:
    result = judge(orjson.dumps(value), which)
    if isinstance(result, RequestInfo):
        check_info(result)


@settings(FUZZ, max_examples=300)
@given(body=mutated_chat())
def test_mutated_chat_bodies(body: dict[str, Any]) -> None:
    result = judge(orjson.dumps(body), validate_chat)
    if isinstance(result, RequestInfo):
        check_info(result)
        assert result.stream is bool(body.get("stream"))


@settings(FUZZ, max_examples=200)
@given(body=valid_chat())
def test_valid_chat_bodies_are_accepted(body: dict[str, Any]) -> None:
    result = judge(orjson.dumps(body), validate_chat)
    assert isinstance(result, RequestInfo), result
    check_info(result)
    assert result.user == body.get("user")


# Regression: the prefix of an array prompt was a *byte* slice of its JSON, decoded: a cut
# through a multi-byte character raised UnicodeDecodeError, a 500 for a valid request.
@settings(FUZZ, max_examples=300)
@example(prompt=["a" + "\u00e9" * 300], prefix_chars=256)
@example(prompt=["\U0001f600" * 100], prefix_chars=7)
@given(
    prompt=st.lists(st.text(min_size=1, max_size=80), min_size=1, max_size=4)
    | st.text(max_size=300),
    prefix_chars=st.integers(1, 300),
)
def test_completion_prompts_give_a_character_prefix(prompt: Any, prefix_chars: int) -> None:
    body = orjson.dumps({"model": MODEL, "prompt": prompt})
    result = judge(body, validate_completion, prefix_chars)
    assert isinstance(result, RequestInfo), result  # even "": an empty prompt is the engine's call
    check_info(result, prefix_chars)
    text = prompt if isinstance(prompt, str) else orjson.dumps(prompt).decode()
    assert result.prefix == text[:prefix_chars]


@settings(FUZZ, max_examples=60)
@given(body=hostile_body(max_bytes=1 << 20), which=st.sampled_from(VALIDATORS))
def test_hostile_bodies(body: bytes, which: Any) -> None:
    result = judge(body, which)
    if isinstance(result, RequestInfo):
        check_info(result)


@pytest.mark.parametrize("kind", ["array", "object"])
@pytest.mark.parametrize("depth", [1000, 1024, 1025, 200_000])
def test_deep_nesting_is_bounded(kind: str, depth: int) -> None:
    for inner in (
        nested(depth, kind),
        b'{"model": "m", "messages": [' + nested(depth, kind) + b"]}",
    ):
        for which in VALIDATORS:
            judge(inner, which)  # no RecursionError, no crash


def test_megabytes_of_text_are_fine() -> None:
    for char in ("x", "\u00e9", "\U0001f600"):
        big = char * (1 << 20)
        body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": big}]})
        info = judge(body, validate_chat)
        assert isinstance(info, RequestInfo)
        assert info.prefix == big[:PREFIX]
        info = judge(orjson.dumps({"model": MODEL, "prompt": [big]}), validate_completion)
        assert isinstance(info, RequestInfo)
        assert len(info.prefix) == PREFIX
