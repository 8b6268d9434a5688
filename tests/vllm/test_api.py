"""vLLM's own OpenAI server on a vLLM unit's leader: what `vllm serve` serves works, with the
`vllm serve` arguments the node was given (a tool-call parser, a structured-output backend, an
API key), and the node contract stays on the health listener.

One single-node unit serves every test (a cold vLLM start costs most of a minute). The tiny
model's text is noise, so the tests check shapes and what decoding was constrained to, not
what was said.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AuthenticationError, OpenAI

from tests.vllm.support import Unit, get_json, start_unit

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.timeout(600),
    pytest.mark.usefixtures("vllm_required"),
]
KEY = "unit-key"
SERVE_ARGS = {
    "enable_auto_tool_choice": True,
    "tool_call_parser": "hermes",
    "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
    "api_key": KEY,
}
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def unit(
    vllm_required: None, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Unit]:
    tmp = tmp_path_factory.mktemp("vllm-api")
    unit = start_unit(tmp, tiny_model, "api", world=1, vllm_args=SERVE_ARGS)
    try:
        unit.wait_ready()
        yield unit
    finally:
        unit.stop()


def client(unit: Unit, key: str = KEY) -> OpenAI:
    return OpenAI(base_url=f"{unit.api}/v1", api_key=key, timeout=120, max_retries=0)


def post(unit: Unit, path: str, body: dict[str, Any], key: str | None = KEY) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"{unit.api}{path}", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_the_api_key_passes_through(unit: Unit) -> None:
    with pytest.raises(AuthenticationError):
        client(unit, key="wrong").models.list()
    status, _ = post(unit, "/v1/completions", {"model": "tiny", "prompt": "x"}, key=None)
    assert status == 401
    assert [m.id for m in client(unit).models.list()] == ["tiny"]


def test_health_listener_keeps_the_contract_and_step_advances(unit: Unit) -> None:
    status, before = get_json(unit.health[0])
    assert status == 200 and before["status"] == "ok"
    assert (before["role"], before["unit"], before["rank"]) == ("leader", "api", 0)
    assert before["pid"] == unit.leader.pid
    response = client(unit).completions.create(
        model="tiny", prompt="count", max_tokens=6, extra_body={"ignore_eos": True}
    )
    assert response.usage is not None and response.usage.completion_tokens == 6
    after = get_json(unit.health[0])[1]
    assert after["step"] - before["step"] >= 6 and after["pending"] == 0
    # The API port answers the contract too (no key needed), for a gateway probing it there.
    assert get_json(f"{unit.api}/health")[1]["step"] == after["step"]


def test_a_named_tool_choice_constrains_the_answer_to_that_tool(unit: Unit) -> None:
    response = client(unit).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=[WEATHER],
        tool_choice=NAMED,
        max_tokens=80,
        temperature=0,
    )
    message = response.choices[0].message
    if message.tool_calls:  # the call ended within max_tokens: vLLM's parser read it
        call = message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_weather"
        return
    # Hermes' envelope with the chosen name: only structured decoding makes noise say that.
    text = "".join((message.content or "").split())
    assert text.startswith('<tool_call>{"name":"get_weather"'), message.content


def test_logprobs_and_several_choices(unit: Unit) -> None:
    response = client(unit).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        n=2,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in response.choices] == [0, 1]
    for choice in response.choices:
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert len(choice.logprobs.content) == 3
        assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)


def test_a_json_schema_response_format_constrains_the_answer(unit: Unit) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    response = client(unit).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "json please"}],
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
        max_tokens=20,
        temperature=0,
    )
    content = response.choices[0].message.content or ""
    assert json.loads(content) in ({"ok": True}, {"ok": False})


def test_token_id_prompts_and_return_token_ids(unit: Unit) -> None:
    """What the gateway's token-exact resumption sends and reads."""
    body = {
        "model": "tiny",
        "prompt": [5, 6, 7, 8],
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    status, answer = post(unit, "/v1/completions", body)
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["prompt_token_ids"] == [5, 6, 7, 8] and len(choice["token_ids"]) == 4


def test_the_responses_and_messages_apis(unit: Unit) -> None:
    response = client(unit).responses.create(model="tiny", input="hello", max_output_tokens=4)
    assert response.object == "response" and response.status in ("completed", "incomplete")
    assert response.usage is not None and 1 <= response.usage.output_tokens <= 4
    status, message = post(
        unit,
        "/v1/messages",
        {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert status == 200, message
    assert message["type"] == "message" and 1 <= message["usage"]["output_tokens"] <= 4
