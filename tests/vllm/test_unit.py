"""A vLLM unit of two nodes (TP=2 across leader and follower) behind the gateway.

One unit, one single-node reference engine and one gateway serve every test here (a cold vLLM
start costs most of a minute), so the tests run in file order and the last one kills the
follower.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from openai import OpenAI

from tests.engine.test_up_support import eventually
from tests.vllm.support import Proc, Unit, get_json, start_gateway, start_unit

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("vllm_required"),
]
GREEDY = {"temperature": 0, "ignore_eos": True, "return_token_ids": True}


@dataclass
class Stack:
    unit: Unit
    single: Unit
    gateway: Proc
    url: str

    def step(self) -> int:
        return int(get_json(self.unit.health[0])[1]["step"])


@pytest.fixture(scope="module")
def stack(
    vllm_required: None, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("vllm-unit")
    unit = start_unit(tmp, tiny_model, "u0", world=2)
    single = start_unit(tmp, tiny_model, "solo", world=1)
    gateway: Proc | None = None
    try:
        unit.wait_ready()
        single.wait_ready()
        gateway, url = start_gateway(tmp, unit)
        eventually(lambda: get_json(f"{url}/readyz")[0] == 200, 30, "the gateway routes to u0")
        yield Stack(unit, single, gateway, url)
    finally:
        if gateway is not None:
            gateway.kill_group()
        unit.stop()
        single.stop()


def complete(base: str, prompt: str, max_tokens: int) -> list[int]:
    client = OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=120, max_retries=0)
    response = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        extra_body=GREEDY,
    )
    assert response.usage is not None and response.usage.completion_tokens == max_tokens
    ids: list[int] = (response.choices[0].model_extra or {})["token_ids"]
    return ids


def test_streams_through_the_gateway_with_the_openai_client(stack: Stack) -> None:
    client = OpenAI(base_url=f"{stack.url}/v1", api_key="unused", timeout=120, max_retries=0)
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello, unit"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=GREEDY,
    )
    chunks = list(stream)
    ids = [
        t
        for c in chunks
        if c.choices
        for t in (c.choices[0].model_extra or {}).get("token_ids", [])
    ]
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["length"]
    assert len(ids) == 12
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert chunks[0].choices[0].delta.role == "assistant"


def test_health_reports_both_nodes_and_step_advances_with_iterations(stack: Stack) -> None:
    (_, leader), (_, follower) = (get_json(url) for url in stack.unit.health)
    assert (leader["role"], leader["unit"], leader["rank"]) == ("leader", "u0", 0)
    assert (follower["role"], follower["unit"], follower["rank"]) == ("follower", "u0", 1)
    assert leader["status"] == follower["status"] == "ok"
    assert leader["pid"] == stack.unit.leader.pid and follower["pid"] == stack.unit.followers[0].pid
    before = stack.step()
    complete(stack.url, "count the steps", max_tokens=10)
    after = get_json(stack.unit.health[0])[1]
    assert after["step"] - before >= 10  # one engine iteration per generated token
    assert after["pending"] == 0


def test_greedy_output_is_identical_to_a_single_node_run(stack: Stack) -> None:
    prompts = ["hello, unit", "The quick brown fox", "Tensor parallel layers split their weights"]
    for prompt in prompts:
        two_nodes = complete(stack.url, prompt, max_tokens=24)
        one_node = complete(stack.single.api, prompt, max_tokens=24)
        assert two_nodes == one_node, prompt


def test_a_client_disconnect_aborts_the_vllm_request(stack: Stack) -> None:
    max_tokens = 900  # many seconds of decoding: only an abort ends it early
    before = stack.step()
    conn, response = open_stream(stack.url, max_tokens)
    events: list[bytes] = []
    for line in iter(response.readline, b""):
        if line.startswith(b"data: "):
            events.append(line)
        if len(events) >= 3:
            break
    response.close()
    conn.close()
    eventually(lambda: get_json(stack.unit.health[0])[1]["pending"] == 0, 10, "request aborted")
    settled = stack.step()
    assert settled - before < max_tokens // 2
    time.sleep(1.0)  # a window in which a request still decoding would move `step`
    assert stack.step() == settled


def open_stream(base: str, max_tokens: int) -> tuple[http.client.HTTPConnection, Any]:
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
    body = {
        "model": "tiny",
        "stream": True,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "go on and on"}],
        **GREEDY,
    }
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    response = conn.getresponse()
    assert response.status == 200, response.read()
    return conn, response


def test_a_killed_follower_ejects_the_unit_and_the_leader_exits(stack: Stack) -> None:
    conn, response = open_stream(stack.unit.api, max_tokens=900)  # the leader is mid-decode
    reader = threading.Thread(target=response.read, daemon=True)
    reader.start()
    eventually(lambda: get_json(stack.unit.health[0])[1]["pending"] == 1, 10, "request running")
    os.killpg(stack.unit.followers[0].pid, signal.SIGKILL)
    eventually(lambda: get_json(f"{stack.url}/readyz")[0] == 503, 15, "the gateway ejects u0")
    code = stack.unit.leader.proc.wait(timeout=180)  # not forever: the node gives up by itself
    assert code == 1, stack.unit.leader.tail()
    eventually(lambda: not stack.unit.leader.group_alive(), 30, "the leader's vLLM processes end")
    conn.close()
