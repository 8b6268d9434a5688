"""Golden prompts: the items checked by name, answers compared, units asked over real sockets."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.config import UnitConfig
from gateway.rollout import golden
from gateway.rollout.golden import (
    DEFAULT_MAX_TOKENS,
    GoldenError,
    GoldenItem,
    ask,
    compare,
    headers_of,
    parse_golden,
    run_golden,
)
from tests.gateway.servers import refused_url, serve_app

MESSAGES = [{"role": "user", "content": "Name three primes."}]


def chat(**body: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MESSAGES, **body}


def item(compare: str = "exact", **body: Any) -> GoldenItem:
    return parse_golden([{"body": chat(**body), "compare": compare}])[0]


def answer(text: str | None = "", calls: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls is not None:
        message["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ]
    return {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": message}]}


def problems(raw: object) -> list[str]:
    with pytest.raises(GoldenError) as caught:
        parse_golden(raw)
    return list(caught.value.problems)


# -- parsing -----------------------------------------------------------------------------------


def test_an_item_is_forced_to_one_plain_answer_at_temperature_0() -> None:
    (one,) = parse_golden([{"body": chat(temperature=0.7)}])
    assert (one.index, one.path, one.compare, one.min_similarity) == (
        0,
        "/v1/chat/completions",
        "exact",
        1.0,
    )
    assert one.body == {
        **chat(),
        "temperature": 0,
        "stream": False,
        "n": 1,
        "max_tokens": DEFAULT_MAX_TOKENS,
    }
    similar = parse_golden(
        [
            {"path": "/v1/completions", "body": {"model": "m", "prompt": "2+2=", "max_tokens": 5}},
            {"body": chat(), "compare": "similar"},
        ]
    )
    assert similar[0].body["max_tokens"] == 5 and similar[0].path == "/v1/completions"
    assert similar[1].min_similarity == 0.9


def test_the_units_name_for_the_model_goes_in_the_payload() -> None:
    sent = json.loads(item().payload("served-name"))
    assert sent["model"] == "served-name"
    assert json.loads(item().payload())["model"] == "m"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("not a list", "golden: must be a list of prompts"),
        ([{"body": chat()}] * 21, "golden: at most 20 prompts, got 21"),
        ([5], "golden[0]: must be an object"),
        (
            [{"body": chat()}, {"body": chat()}, {"body": chat(), "compare": "fuzzy"}],
            "golden[2].compare: must be 'exact' or 'similar'",
        ),
        (
            [{"body": chat(), "path": "/v1/embeddings"}],
            "golden[0].path: must be /v1/chat/completions or /v1/completions",
        ),
        ([{"body": chat(), "cmp": "exact"}], "golden[0].cmp: unknown key"),
        ([{}], "golden[0].body: must be the request's JSON object"),
        ([{"body": {"messages": MESSAGES}}], "golden[0].body.model: must name the model"),
        ([{"body": {"model": "m"}}], "golden[0].body.messages: must be a non-empty list"),
        (
            [{"path": "/v1/completions", "body": {"model": "m"}}],
            "golden[0].body.prompt: is required (a string or a list)",
        ),
        (
            [{"body": chat(stream=True)}],
            "golden[0].body.stream: must be false or absent (answers are compared whole)",
        ),
        (
            [{"body": chat(stream_options={"include_usage": True})}],
            "golden[0].body.stream_options: only applies to a stream",
        ),
        (
            [{"body": chat(n=2)}],
            "golden[0].body.n: must be 1 or absent (one answer per revision), got 2",
        ),
        ([{"body": chat(max_tokens=0)}], "golden[0].body.max_tokens: must be a whole number"),
        ([{"body": chat(max_tokens=5000)}], "golden[0].body.max_tokens: must be a whole number"),
        (
            [{"body": chat(max_completion_tokens="8")}],
            "golden[0].body.max_completion_tokens: must be a whole number",
        ),
        (
            [{"body": chat(), "min_similarity": 0.5}],
            "golden[0].min_similarity: only applies to compare 'similar'",
        ),
        (
            [{"body": chat(), "compare": "similar", "min_similarity": 0}],
            "golden[0].min_similarity: must be a number in (0, 1], got 0",
        ),
        (
            [{"body": chat(response_format={"type": "yaml"})}],
            "golden[0].body.response_format.type: must be one of",
        ),
        (
            [{"body": chat(response_format={"type": "json_schema", "json_schema": {}})}],
            "golden[0].body.response_format.json_schema.schema: must be a JSON schema",
        ),
        (
            [
                {
                    "body": chat(
                        response_format={
                            "type": "json_schema",
                            "json_schema": {"name": "s", "schema": {"type": "banana"}},
                        }
                    )
                }
            ],
            "golden[0].body.response_format.json_schema.schema: is not a valid schema",
        ),
    ],
)
def test_each_mistake_is_named_with_its_index(raw: object, expected: str) -> None:
    found = problems(raw)
    assert any(p.startswith(expected) for p in found), found


def test_every_mistake_is_reported_at_once_and_is_a_value_error() -> None:
    found = problems([{"body": chat(n=3), "compare": "x"}, {"body": chat(stream=True)}])
    assert [p.split(":")[0] for p in found] == [
        "golden[0].compare",
        "golden[0].body.n",
        "golden[1].body.stream",
    ]
    with pytest.raises(ValueError, match=r"golden\[0\]\.compare: .*; golden\[0\]\.body\.n"):
        parse_golden([{"body": chat(n=3), "compare": "x"}])


# -- comparing ---------------------------------------------------------------------------------


def test_exact_text_passes_only_when_equal() -> None:
    same = compare(item(), answer("2, 3 and 5."), answer("2, 3 and 5."))
    assert same.passed and same.similarity == 1.0 and same.reason == "The answers are the same."
    other = compare(item(), answer("2, 3 and 5."), answer("2, 3 and 7."))
    assert not other.passed and not other.inconclusive
    assert other.reason.startswith("The answers differ from character 9 on (similarity 0.")
    assert 0.7 < other.similarity < 1.0


def test_similar_text_passes_above_its_threshold() -> None:
    old = "The first three primes are 2, 3 and 5, the smallest of them being the only even one."
    near = old.replace("smallest", "least")
    far = "I would rather not say."
    loose = item("similar")
    assert compare(loose, answer(old), answer(near)).passed
    result = compare(loose, answer(old), answer(far))
    assert not result.passed and result.similarity < 0.2
    assert result.reason.startswith("The answers' similarity is 0.")
    assert "below the 0.9 asked for" in result.reason


def test_a_completion_answer_is_compared_by_its_text() -> None:
    (one,) = parse_golden([{"path": "/v1/completions", "body": {"model": "m", "prompt": "2+2="}}])
    text = {"choices": [{"index": 0, "text": " 4"}]}
    assert compare(one, text, text).passed
    assert not compare(one, text, {"choices": [{"index": 0, "text": " 5"}]}).passed


def test_the_old_revision_failing_is_inconclusive_the_new_one_failing_fails() -> None:
    broken = {"status": 500, "error": "it answered 500: boom"}
    inconclusive = compare(item(), broken, answer("x"))
    assert inconclusive.inconclusive and not inconclusive.passed
    assert inconclusive.reason == (
        "Inconclusive: the old revision could not answer (it answered 500: boom)."
    )
    failed = compare(item(), answer("x"), {"error": {"message": "model not loaded"}})
    assert not failed.passed and not failed.inconclusive
    assert failed.reason == "The new revision could not answer (model not loaded)."
    empty = compare(item(), answer("x"), {"choices": []})
    assert empty.reason == "The new revision could not answer (its answer has no choices)."


WEATHER = ("get_weather", '{"city": "Paris", "unit": "C"}')


def test_tool_calls_the_same_pass() -> None:
    spaced = ("get_weather", '{"unit":"C",  "city":"Paris"}')  # the same JSON value
    assert compare(item(), answer(None, [WEATHER]), answer(None, [spaced])).passed


def test_tool_calls_must_name_the_same_functions_in_order() -> None:
    two = [WEATHER, ("get_time", "{}")]
    swapped = compare(item(), answer(None, two), answer(None, two[::-1]))
    assert not swapped.passed
    assert swapped.reason == (
        "The new revision called ['get_time', 'get_weather'] where the old one called "
        "['get_weather', 'get_time']."
    )
    missing = compare(item(), answer(None, [WEATHER]), answer("It is sunny."))
    assert not missing.passed
    assert missing.reason == "The old revision called ['get_weather']; the new one called no tool."
    extra = compare(item(), answer("It is sunny."), answer(None, [WEATHER]))
    assert extra.reason == (
        "The new revision called ['get_weather'] where the old one answered in text."
    )


def test_tool_call_arguments_must_be_a_json_object() -> None:
    for bad in ('{"city": "Par', '["Paris"]'):
        result = compare(
            item("similar"), answer(None, [WEATHER]), answer(None, [("get_weather", bad)])
        )
        assert not result.passed
        assert (
            result.reason == "The new revision's call 0 has arguments that are not a JSON object."
        )


def test_tool_call_arguments_must_be_equal_under_exact_only() -> None:
    lyon = ("get_weather", '{"city": "Lyon", "unit": "C"}')
    exact = compare(item(), answer(None, [WEATHER]), answer(None, [lyon]))
    assert not exact.passed
    assert exact.reason == "The new revision's call 0 has other arguments than the old one's."
    assert compare(item("similar"), answer(None, [WEATHER]), answer(None, [lyon])).passed


SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "primes",
        "schema": {
            "type": "object",
            "properties": {"primes": {"type": "array", "items": {"type": "integer"}}},
            "required": ["primes"],
        },
    },
}


def test_a_json_schema_answer_must_match_it() -> None:
    structured = item("similar", response_format=SCHEMA)
    good = '{"primes": [2, 3, 5]}'
    assert compare(structured, answer(good), answer('{ "primes" : [2, 3, 5] }')).passed
    wrong = compare(structured, answer(good), answer('{"primes": ["two"]}'))
    assert not wrong.passed
    assert wrong.reason == (
        "The new revision's answer does not match its schema: 'two' is not of type 'integer'."
    )
    prose = compare(structured, answer(good), answer("Sure! 2, 3 and 5."))
    assert prose.reason == (
        "The new revision's answer is not JSON, though response_format asks for json_schema."
    )


def test_json_answers_compare_as_values_under_exact() -> None:
    structured = item(response_format={"type": "json_object"})
    assert compare(structured, answer('{"a": 1, "b": 2}'), answer('{"b":2,"a":1}')).passed
    assert not compare(structured, answer('{"a": 1}'), answer("{a: 1}")).passed


def test_without_jsonschema_the_answer_is_only_parsed_and_the_reason_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(golden, "_jsonschema", lambda: None)
    structured = item("similar", response_format=SCHEMA)
    result = compare(structured, answer('{"primes": [2]}'), answer('{"primes": ["two"]}'))
    assert not result.passed  # similarity, not the schema, decides here
    assert "not checked against its schema: jsonschema is not installed" in result.reason
    same = compare(structured, answer('{"primes": [2]}'), answer('{"primes": [2]}'))
    assert same.passed and "jsonschema is not installed" in same.reason


# -- asking ------------------------------------------------------------------------------------


@dataclass
class Unit:
    config: UnitConfig
    extra_head: bytes = b""

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def leader(self) -> str:
        return self.config.leader


def canned(text: str, seen: list[tuple[dict[str, str], Any]]) -> web.Application:
    async def completions(request: web.Request) -> web.Response:
        seen.append((dict(request.headers), await request.json()))
        return web.json_response(answer(text))

    async def broken(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "out of memory"}}, status=500)

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response()

    async def html(request: web.Request) -> web.Response:
        return web.Response(text="<html>")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/broken", broken)
    app.router.add_post("/hang", hang)
    app.router.add_post("/html", html)
    return app


async def test_ask_returns_the_answer_or_describes_the_failure() -> None:
    seen: list[tuple[dict[str, str], Any]] = []
    body = item().payload()
    async with serve_app(canned("hello", seen)) as base, aiohttp.ClientSession() as session:
        got = await ask(session, base, "/v1/chat/completions", body, {"X-Unit": "a"}, 5.0)
        failed = await ask(session, base, "/broken", body, {}, 5.0)
        started = asyncio.get_running_loop().time()
        slow = await ask(session, base, "/hang", body, {}, 0.3)
        waited = asyncio.get_running_loop().time() - started
        html = await ask(session, base + "/", "/html", body, {}, 5.0)
        with refused_url() as nobody:
            refused = await ask(session, nobody, "/v1/chat/completions", body, {}, 5.0)
    assert got == answer("hello")
    assert seen[0][0]["X-Unit"] == "a" and seen[0][0]["Content-Type"] == "application/json"
    assert seen[0][1]["temperature"] == 0
    assert failed == {"status": 500, "error": "it answered 500: out of memory"}
    assert slow == {"status": None, "error": "no answer within 0.3 s"} and waited < 5
    assert html == {"status": 200, "error": "it answered 200 with a body that is not a JSON object"}
    assert refused["status"] is None and refused["error"].startswith("it could not be reached: ")


def test_a_units_header_lines_become_headers() -> None:
    head = b"X-Team: ml\r\nAuthorization: Bearer k3y\r\n"
    assert headers_of(head) == {"X-Team": "ml", "Authorization": "Bearer k3y"}
    assert headers_of(b"") == {}


async def test_run_golden_asks_both_units_with_their_own_headers_and_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("UNITGATE_TEST_UNIT_KEY", "k3y")
    old_seen: list[tuple[dict[str, str], Any]] = []
    new_seen: list[tuple[dict[str, str], Any]] = []
    items = parse_golden([{"body": chat()}, {"body": chat(max_tokens=8), "compare": "similar"}])
    async with (
        serve_app(canned("2, 3 and 5.", old_seen)) as old_base,
        serve_app(canned("2, 3 and 7.", new_seen)) as new_base,
        aiohttp.ClientSession() as session,
    ):
        new_config = UnitConfig(
            id="new",
            leader=new_base,
            served_model="served-m",
            api_key_env="UNITGATE_TEST_UNIT_KEY",
            headers={"X-Revision": "v2"},
        )
        old = Unit(UnitConfig(id="old", leader=old_base))
        new = Unit(new_config, new_config.header_lines())
        results = await run_golden(items, old, new, session, within=5.0)
    assert [r.index for r in results] == [0, 1]
    assert not results[0].passed and results[1].passed is False  # 5 vs 7: 0.8 < 0.9
    assert 0.7 < results[1].similarity < 0.9
    assert len(old_seen) == len(new_seen) == 2
    headers, body = new_seen[0]
    assert headers["Authorization"] == "Bearer k3y" and headers["X-Revision"] == "v2"
    assert body["model"] == "served-m" and old_seen[0][1]["model"] == "m"
    assert "Authorization" not in old_seen[0][0]
