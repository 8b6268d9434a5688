"""Leader server, field policy: nothing is dropped in silence. A field the engine cannot honour
is a 400 naming it, its neutral values are accepted, an unknown field is refused by name, and
every field the project itself sends (gateway, canary, load tools) is accepted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from engine.scheduler import SamplingParams
from engine.server import fields
from engine.server.fields import CHAT, COMPLETION, MESSAGE, STREAM_OPTIONS, Policy
from gateway.health.probe import canary
from gateway.proxy.continuation import _SAMPLING, continuation, with_token_ids
from gateway.upstream.pool import ConnectionPool, Endpoint
from loadtest.bench.vllm import one_request
from loadtest.gen.workload import Workload, WorkloadConfig
from tests.engine.test_server_double import (
    MODEL,
    FakeEngine,
    chat_body,
    completion_body,
    post,
    served,
)

CHAT_URL, COMPLETION_URL = "/v1/chat/completions", "/v1/completions"
POLICIES = {CHAT_URL: CHAT, COMPLETION_URL: COMPLETION}
# A valid value for every honoured top-level field but the prompt itself.
HONOURED_SAMPLES: dict[str, Any] = {
    "model": MODEL,
    "stream": False,
    "stream_options": {"include_usage": True},
    "max_tokens": 3,
    "max_completion_tokens": 3,
    "temperature": 0.5,
    "top_p": 0.9,
    "seed": 7,
    "stop": ["\n\n"],
    "stop_token_ids": [9],
    "ignore_eos": True,
    "n": 1,
    "return_token_ids": True,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "repetition_penalty": 1.1,
    "logit_bias": {"65": 2},
    "logprobs": None,
    "priority": 5,
    "response_format": {"type": "text"},
    "structured_outputs": None,
    "tools": [],
    "tool_choice": "none",
    "parallel_tool_calls": False,
    "top_logprobs": None,
}
IGNORED_SAMPLES: dict[str, Any] = {
    "user": "u-42",
    "metadata": {"team": "search"},
    "store": True,
    "service_tier": "flex",
    "safety_identifier": "hash-1",
    "prompt_cache_key": "k",
    "cache_salt": "s",
    "request_id": "r-1",
    "guided_decoding_backend": "xgrammar",
    "guided_whitespace_pattern": r"\s*",
    "length_penalty": 1.2,
}
NOT_NEUTRAL = {"no engine": "neutral"}  # neutral for no field
SCHEMA = {"name": "shoe", "schema": {"type": "object", "properties": {"size": {"type": "integer"}}}}
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def body_for(path: str, **extra: Any) -> dict[str, Any]:
    return chat_body(**extra) if path == CHAT_URL else completion_body(**extra)


def refused_cases() -> list[Any]:
    return [
        pytest.param(path, name, id=f"{path.split('/')[-1]}-{name}")
        for path, policy in POLICIES.items()
        for name in policy.refused
    ]


def neutral_cases() -> list[Any]:
    return [
        pytest.param(path, name, value, id=f"{path.split('/')[-1]}-{name}-{value!r}")
        for path, policy in POLICIES.items()
        for name, neutral in policy.refused.items()
        for value in (None, *neutral)
    ]


@pytest.fixture
async def engine_url() -> AsyncIterator[tuple[FakeEngine, str]]:
    engine = FakeEngine(max_seq_len=1024)
    async with served(engine) as url:
        yield engine, url


async def refusal(url: str, body: dict[str, Any]) -> dict[str, Any]:
    status, answer = await post(url, body)
    assert status == 400, answer
    error: dict[str, Any] = answer["error"]
    assert error["type"] == "invalid_request_error"
    return error


async def test_a_schema_the_grammar_cannot_enforce_is_refused_with_why(
    engine_url: tuple[FakeEngine, str],
) -> None:
    """strict: every keyword is enforced or the request is refused, naming the schema."""
    engine, url = engine_url
    schema = {"type": "string", "format": "hostname-of-the-moon"}
    spec = {"name": "odd", "schema": schema, "strict": True}
    for path in POLICIES:
        body = body_for(path, response_format={"type": "json_schema", "json_schema": spec})
        error = await refusal(url + path, body)
        assert error["param"] == "response_format.json_schema.schema"
        assert "cannot be used for constrained decoding" in error["message"]
    assert engine.requests == []


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"functions": [TOOL["function"]]}, "functions"),
        ({"function_call": {"name": "lookup"}}, "function_call"),
        ({"guided_json": SCHEMA["schema"]}, "guided_json"),
        ({"guided_choice": ["yes", "no"]}, "guided_choice"),
        ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
        ({"top_k": 40}, "top_k"),
        ({"min_tokens": 5}, "min_tokens"),
        ({"guided_regex": "[0-9]+"}, "guided_regex"),
        ({"skip_special_tokens": False}, "skip_special_tokens"),
        ({"include_stop_str_in_output": True}, "include_stop_str_in_output"),
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
        ({"echo": True}, "echo"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        (
            {"stream_options": {"continuous_usage_stats": True}},
            "stream_options.continuous_usage_stats",
        ),
        ({"stream_options": {"include_usage": True, "verbose": 1}}, "stream_options.verbose"),
    ],
)
async def test_chat_features_this_engine_lacks_are_refused_by_name(
    engine_url: tuple[FakeEngine, str], extra: dict[str, Any], param: str
) -> None:
    _, url = engine_url
    error = await refusal(url + CHAT_URL, chat_body(**extra))
    assert error["param"] == param


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user", "content": "hi", "name": "ana"}, "messages[0].name"),
        (
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]},
            "messages[0].tool_calls[0].type",
        ),
        ({"role": "tool", "content": "72 F"}, "messages[0].tool_call_id"),
        ({"role": "assistant", "content": "no", "refusal": "no"}, "messages[0].refusal"),
        ({"role": "user", "content": "hi", "mood": "calm"}, "messages[0].mood"),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            "messages[0].content",
        ),
        ({"role": "user", "content": [{"type": "input_audio"}]}, "messages[0].content"),
        ({"role": "user", "content": [{"text": "typeless"}]}, "messages[0].content"),
        ({"role": "user", "content": [{"type": "text", "text": 5}]}, "messages[0].content"),
        (
            {"role": "user", "content": [{"type": "text", "text": "a", "detail": "high"}]},
            "messages[0].content[0].detail",
        ),
    ],
)
async def test_message_fields_the_template_never_sees_are_refused(
    engine_url: tuple[FakeEngine, str], message: dict[str, Any], param: str
) -> None:
    _, url = engine_url
    error = await refusal(url + CHAT_URL, chat_body(messages=[message]))
    assert error["param"] == param


async def test_non_text_part_is_named_by_type(engine_url: tuple[FakeEngine, str]) -> None:
    _, url = engine_url
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]
    body = chat_body(messages=[{"role": "user", "content": parts}])
    error = await refusal(url + CHAT_URL, body)
    assert "'messages[0].content[1]' is a part of type 'image_url'" in error["message"]


@pytest.mark.parametrize(("path", "name"), refused_cases())
async def test_every_refused_field_is_refused_with_its_name(
    engine_url: tuple[FakeEngine, str], path: str, name: str
) -> None:
    engine, url = engine_url
    error = await refusal(url + path, body_for(path, **{name: NOT_NEUTRAL}))
    assert error["param"] == name
    assert error["message"].startswith(f"'{name}' is not supported by this engine")
    assert engine.requests == []


@pytest.mark.parametrize(("path", "name", "value"), neutral_cases())
async def test_neutral_values_are_accepted(
    engine_url: tuple[FakeEngine, str], path: str, name: str, value: object
) -> None:
    engine, url = engine_url
    status, answer = await post(url + path, body_for(path, max_tokens=2, **{name: value}))
    assert status == 200, answer
    assert engine.requests[0].params == SamplingParams(max_tokens=2)


@pytest.mark.parametrize("path", POLICIES)
async def test_ignored_fields_are_accepted_and_change_nothing(
    engine_url: tuple[FakeEngine, str], path: str
) -> None:
    engine, url = engine_url
    assert set(IGNORED_SAMPLES) == POLICIES[path].ignored
    options = {"include_usage": False, "include_obfuscation": True}
    body = body_for(path, max_tokens=2, stream_options=options, **IGNORED_SAMPLES)
    status, answer = await post(url + path, body)
    assert status == 200, answer
    assert engine.requests[0].params == SamplingParams(max_tokens=2)


@pytest.mark.parametrize(("path", "other"), [(CHAT_URL, "prompt"), (COMPLETION_URL, "messages")])
async def test_unknown_fields_are_refused_by_name(
    engine_url: tuple[FakeEngine, str], path: str, other: str
) -> None:
    _, url = engine_url
    for name in ("frobnicate", "Temperature", other):
        error = await refusal(url + path, body_for(path, **{name: None}))
        assert error["param"] == name
        assert error["message"].startswith(f"Unrecognized request argument supplied: '{name}'")


async def test_first_refused_field_in_request_order_is_named(
    engine_url: tuple[FakeEngine, str],
) -> None:
    _, url = engine_url
    body = {"model": MODEL, "top_k": 5, "messages": [{"role": "user", "content": "hi"}]}
    error = await refusal(url + CHAT_URL, {**body, "tools": [TOOL]})
    assert error["param"] == "top_k"


async def streamed(url: str, body: bytes) -> str:
    """A streamed answer's text, after checking it was a 200 that finished."""
    async with aiohttp.ClientSession() as session, session.post(url, data=body) as response:
        text = await response.text()
    assert response.status == 200, text
    assert text.endswith("data: [DONE]\n\n"), text
    return text


def accepted_value(policy: Policy, name: str) -> object:
    if name in policy.honoured:
        return HONOURED_SAMPLES[name]
    if name in policy.ignored:
        return IGNORED_SAMPLES[name]
    neutral = policy.refused[name]
    return neutral[0] if neutral else None


def test_every_continued_sampling_field_is_judged_alike_on_both_endpoints() -> None:
    """The gateway continues a broken chat stream as a completion carrying the client's own
    values of `_SAMPLING`: a field the engine accepted on chat must not be refused there."""
    for name in (*_SAMPLING, "min_tokens"):
        assert CHAT.known(name) and COMPLETION.known(name), f"engine does not know {name!r}"
        assert (name in CHAT.honoured) == (name in COMPLETION.honoured), name
        assert (name in CHAT.ignored) == (name in COMPLETION.ignored), name
        assert CHAT.refused.get(name) == COMPLETION.refused.get(name), name


async def test_the_gateways_requests_are_accepted(engine_url: tuple[FakeEngine, str]) -> None:
    engine, url = engine_url
    client = chat_body(
        stream=True, max_tokens=4, min_tokens=0, stream_options={"include_usage": True}
    )
    client |= {name: accepted_value(CHAT, name) for name in _SAMPLING}
    await streamed(url + CHAT_URL, with_token_ids(client))
    resumed = continuation(client, MODEL, [1, 2, 3], 2, done=2)
    assert set(_SAMPLING) <= set(orjson.loads(resumed))  # every field travelled
    await streamed(url + COMPLETION_URL, resumed)
    assert len(engine.requests) == 2


async def test_the_canary_and_load_tools_are_accepted(engine_url: tuple[FakeEngine, str]) -> None:
    _, url = engine_url
    pool = ConnectionPool(1.0, 30.0, 0)
    try:
        assert await canary(pool, Endpoint(url), MODEL, 5.0) is None
    finally:
        pool.close()
    workload = Workload(WorkloadConfig(model=MODEL, max_tokens=3, ignore_eos=True))
    await streamed(url + CHAT_URL, workload.next_request().body)
    async with aiohttp.ClientSession() as http:
        _, tokens = await one_request(http, url, MODEL, 3)
    assert tokens == 3


def test_the_docstring_lists_every_field() -> None:
    """The module docstring is the written-down policy: a table entry it omits is a silent
    change of policy."""
    doc = fields.__doc__ or ""
    for policy in (CHAT, COMPLETION, STREAM_OPTIONS, MESSAGE):
        for name in (*policy.honoured, *policy.ignored, *policy.refused):
            assert name in doc, f"{name!r} ({policy.where}) is missing from fields.py's docstring"


def test_policy_decisions_are_pure() -> None:
    assert CHAT.problem("tools", [{"type": "function"}]) is None  # honoured: checked later
    assert CHAT.problem("echo", False) is None and CHAT.problem("echo", True) is not None
    assert CHAT.problem("top_k", False) is not None  # false is not the integer 0
    assert COMPLETION.problem("add_special_tokens", True) is None
    assert CHAT.problem("add_special_tokens", True) is not None  # chat's default is false
    assert CHAT.problem("user", 12) is None
