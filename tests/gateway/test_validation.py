"""Request validation: each malformed input gets a precise 4xx."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import InvalidRequest
from gateway.proxy.validation import parse_body, validate_chat, validate_completion

MODELS = frozenset({"m"})


def chat(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(over)
    return body


def test_valid_chat_extracts_routing_keys() -> None:
    info = validate_chat(chat(stream=True, user="alice"), MODELS, 256)
    assert (info.model, info.stream, info.user, info.prefix) == ("m", True, "alice", "hi")


def test_prefix_is_bounded_and_spans_messages() -> None:
    messages = [{"role": "system", "content": "s" * 10}, {"role": "user", "content": "u" * 10}]
    assert validate_chat(chat(messages=messages), MODELS, 15).prefix == "s" * 10 + "\x1e" + "u" * 4


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe{}", "not valid UTF-8"),
        (b"[1, 2]", "must be a JSON object"),
        (b"", "not valid JSON"),
    ],
)
def test_unparseable_bodies(raw: bytes, needle: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_body(raw)
    assert needle in err.value.message and err.value.status == 400


@pytest.mark.parametrize(
    ("body", "param", "status"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model", 400),
        (chat(model=3), "model", 400),
        (chat(model="other"), "model", 404),
        ({"model": "m"}, "messages", 400),
        (chat(messages="hi"), "messages", 400),
        (chat(messages=[]), "messages", 400),
        (chat(messages=[1]), "messages[0]", 400),
        (chat(messages=[{"role": "robot", "content": "x"}]), "messages[0].role", 400),
        (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content", 400),
        (chat(messages=[{"role": "user"}]), "messages[0].content", 400),
        (chat(stream="yes"), "stream", 400),
        (chat(max_tokens=0), "max_tokens", 400),
        (chat(max_tokens=True), "max_tokens", 400),
        (chat(max_tokens=1.5), "max_tokens", 400),
        (chat(temperature=3), "temperature", 400),
        (chat(temperature="hot"), "temperature", 400),
        (chat(top_p=-0.1), "top_p", 400),
        (chat(stop=[1]), "stop", 400),
        (chat(user=7), "user", 400),
        (chat(stream_options=[]), "stream_options", 400),
    ],
)
def test_chat_rejections(body: dict[str, Any], param: str, status: int) -> None:
    with pytest.raises(InvalidRequest) as err:
        validate_chat(body, MODELS, 256)
    assert err.value.param == param
    assert err.value.status == status
    payload = orjson.loads(err.value.body())
    assert payload["error"]["param"] == param and payload["error"]["message"]


def test_assistant_without_content_is_fine() -> None:
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": []},
    ]
    validate_chat(chat(messages=messages), MODELS, 256)


@pytest.mark.parametrize("prompt", ["hello", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_valid_prompts(prompt: Any) -> None:
    info = validate_completion({"model": "m", "prompt": prompt}, MODELS, 8)
    assert info.model == "m" and len(info.prefix) <= 8


@pytest.mark.parametrize("prompt", [None, [], 5, [1, "a"], [[1], []], [-1], {"a": 1}, [True]])
def test_invalid_prompts(prompt: Any) -> None:
    with pytest.raises(InvalidRequest) as err:
        validate_completion({"model": "m", "prompt": prompt}, MODELS, 8)
    assert err.value.param == "prompt"
