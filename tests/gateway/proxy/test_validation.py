"""Request validation: what the gateway reads gets a precise 4xx; the rest is the unit's."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import InvalidRequest
from gateway.proxy.apis import validate_embeddings, validate_messages, validate_responses
from gateway.proxy.validation import Served, parse_body, validate_chat, validate_completion

MODELS = Served.of(["m"])
SEVERAL = Served.of(["m", "n"])


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
    ("body", "served", "param", "status"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, SEVERAL, "model", 400),
        (chat(model=None), SEVERAL, "model", 400),
        (chat(model=3), MODELS, "model", 400),
        (chat(model="other"), MODELS, "model", 404),
        (chat(stream="yes"), MODELS, "stream", 400),
    ],
)
def test_chat_rejections(body: dict[str, Any], served: Served, param: str, status: int) -> None:
    with pytest.raises(InvalidRequest) as err:
        validate_chat(body, served, 256)
    assert err.value.param == param
    assert err.value.status == status
    payload = orjson.loads(err.value.body())
    assert payload["error"]["param"] == param and payload["error"]["message"]


@pytest.mark.parametrize(
    "body",
    [
        chat(messages=[{"role": "my-custom-role", "content": "x"}]),
        chat(messages=[{"role": "user", "content": 5}], max_tokens=0, temperature=3),
        chat(messages=[1, {"role": "user"}], stop=[1], user=7, stream_options=[]),
        chat(messages="hi", seed=-(2**63) - 1, max_tokens=1.5, n=True, top_p=-0.1),
        {"model": "m"},
    ],
)
def test_what_the_gateway_does_not_read_is_the_units(body: dict[str, Any]) -> None:
    """vLLM renders any role its chat template knows and judges its own fields: the gateway
    routes these (their units answer for them)."""
    info = validate_chat(body, MODELS, 256)
    assert info.model == "m" and info.user is None


@pytest.mark.parametrize("model", [None, ""])
def test_a_left_out_model_is_the_default(model: str | None) -> None:
    """vLLM reads null and "" as left out too."""
    body = {"prompt": "x"} if model is None else {"model": model, "prompt": "x"}
    assert validate_completion(body, MODELS, 8).model == "m"
    assert validate_completion(body, Served.of(["m", "n"], "n"), 8).model == "n"
    assert validate_responses({**body, "input": "x"}, MODELS, 8).model == "m"
    assert validate_embeddings({**body, "input": "x"}, MODELS, 8).model == "m"


def test_anthropics_messages_name_their_model() -> None:
    body = {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(InvalidRequest) as err:
        validate_messages(body, MODELS, 8)
    assert (err.value.param, err.value.status) == ("model", 400)
    assert validate_messages({**body, "model": "m"}, MODELS, 8).model == "m"


def test_the_default_of_one_model_is_that_model() -> None:
    assert Served.of(["m"]) == Served(frozenset({"m"}), "m")
    assert Served.of(["m", "n"]).default is None
    assert Served.of(["m", "n"], "n").default == "n"


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


@pytest.mark.parametrize(
    ("prompt", "prefix"),
    [
        (None, ""),
        ([], "[]"),
        (5, "5"),
        ([[1], []], "[[1],[]]"),
        ([2**64], "[1844674"),
        ([-1], "[-1]"),
    ],
)
def test_any_prompt_is_the_units_to_judge(prompt: Any, prefix: str) -> None:
    """A completion may have no prompt (`prompt_embeds`); an integer beyond 64 bits keys its
    prefix as it is spelled."""
    body = {"model": "m", "prompt_embeds": "AAAA"} if prompt is None else {"prompt": prompt}
    assert validate_completion(body, MODELS, 8).prefix == prefix
