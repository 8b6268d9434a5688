"""What reaches the server and how answers are counted, against a recording OpenAI-shaped
server on a real socket: API key and headers, the model from /v1/models, both endpoints
streamed and not, and every source of the output token count."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.gen.shapes import RunConfig, Runner
from loadtest.gen.tokens import TokenCounter
from loadtest.gen.workload import Workload, WorkloadConfig
from tests.loadtest.openai_recorder import USAGE_TOKENS, Recorder, serving, word_tokenizer
from tests.support import ROOT

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def _loadtest(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "UNITGATE_API_KEY"}
    return subprocess.run(
        [sys.executable, "-m", "loadtest", "--no-progress", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**environ, **(env or {})},
    )


async def test_api_key_and_headers_reach_the_server_and_stay_out_of_the_result(
    tmp_path: Path,
) -> None:
    recorder = Recorder()
    async with serving(recorder) as url:
        done = await asyncio.to_thread(
            _loadtest, "--url", url, "--requests", "3", "--api-key", "s3cret-key",
            "--header", "X-Team: load", "--header", "x-trace:abc", "--out", str(tmp_path),
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [s.path for s in recorder.seen] == ["/v1/models", CHAT, CHAT, CHAT]
    for seen in recorder.seen:  # the model listing carries them too
        assert seen.headers["Authorization"] == "Bearer s3cret-key"
        assert (seen.headers["X-Team"], seen.headers["x-trace"]) == ("load", "abc")
    text = (tmp_path / "result.json").read_text()
    assert "s3cret-key" not in text
    config = json.loads(text)["config"]
    assert config["header_names"] == ["Authorization", "X-Team", "x-trace"]


async def test_the_api_key_comes_from_unitgate_api_key_never_openai_api_key() -> None:
    recorder = Recorder()
    env = {"UNITGATE_API_KEY": "from-env", "OPENAI_API_KEY": "personal"}
    async with serving(recorder) as url:
        done = await asyncio.to_thread(_loadtest, "--url", url, "--requests", "1", env=env)
        assert done.returncode == 0, done.stderr
        assert {s.headers["Authorization"] for s in recorder.seen} == {"Bearer from-env"}
        recorder.seen.clear()
        env = {"OPENAI_API_KEY": "personal"}
        done = await asyncio.to_thread(_loadtest, "--url", url, "--requests", "1", env=env)
    assert done.returncode == 0, done.stderr
    assert all("Authorization" not in s.headers for s in recorder.seen)


async def test_the_model_defaults_to_the_first_listed_and_says_so() -> None:
    recorder = Recorder(model_ids=("first", "second"))
    async with serving(recorder) as url:
        done = await asyncio.to_thread(_loadtest, "--url", url, "--requests", "2")
        given = await asyncio.to_thread(
            _loadtest, "--url", url, "--requests", "1", "--model", "second"
        )
    assert done.returncode == 0 and given.returncode == 0, done.stderr + given.stderr
    bodies = [s.body for s in recorder.requests(CHAT)]
    assert [b["model"] for b in bodies if b is not None] == ["first", "first", "second"]
    assert "model: first, the first of 2 listed at /v1/models (first, second)" in done.stderr
    assert given.stderr == ""  # --model given: /v1/models is not asked
    assert len(recorder.requests("/v1/models")) == 1


@pytest.mark.parametrize("stream", [True, False])
async def test_the_completions_endpoint_sends_a_prompt(stream: bool, tmp_path: Path) -> None:
    recorder = Recorder()
    flags = () if stream else ("--no-stream",)
    async with serving(recorder) as url:
        done = await asyncio.to_thread(
            _loadtest, "--url", url, "--model", "m1", "--requests", "2", "--endpoint",
            "completions", "--max-tokens", "9", *flags, "--out", str(tmp_path),
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    one, _ = recorder.requests(COMPLETIONS)
    assert one.body is not None and isinstance(one.body["prompt"], str)
    assert "messages" not in one.body and one.body["max_tokens"] == 9
    assert one.body["stream"] is stream
    assert ("stream_options" in one.body) is stream
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["config"]["endpoint"], result["config"]["stream"]) == ("completions", stream)
    summary = result["summary"]
    assert summary["succeeded"] == 2 and summary["output_tokens"] == 2 * USAGE_TOKENS
    assert summary["e2e_ms"]["count"] == 2
    assert summary["ttft_ms"]["count"] == (2 if stream else 0)  # a whole answer has no TTFT


@pytest.mark.parametrize(
    ("recorder", "endpoint", "stream", "tokenizer", "count", "source"),
    [
        (Recorder(), "chat", True, False, USAGE_TOKENS, "usage"),
        (Recorder(), "completions", False, False, USAGE_TOKENS, "usage"),
        (Recorder(usage=False, token_ids=True), "chat", True, True, 6, "token_ids"),
        (Recorder(usage=False), "chat", True, True, 3, "tokenizer"),
        (Recorder(usage=False), "completions", False, True, 3, "tokenizer"),
        (Recorder(usage=False), "chat", True, False, 2, "chunks"),
        (Recorder(usage=False), "chat", False, False, 4, "estimate"),  # 3 words / 0.75
    ],
)
async def test_output_tokens_come_from_the_best_source(
    recorder: Recorder, endpoint: str, stream: bool, tokenizer: bool, count: int, source: str
) -> None:
    """Usage first, then token ids, then the local tokenizer, then an approximation."""
    counter = TokenCounter(word_tokenizer(), "words") if tokenizer else None
    config = WorkloadConfig("m1", endpoint=endpoint, stream=stream)  # type: ignore[arg-type]
    async with serving(recorder) as url:
        run = RunConfig(url=url, concurrency=1, requests=2, headers=(("X-A", "1"),))
        state = await Runner(run, Workload(config, tokenizer=counter)).run()
    assert [r.error for r in state.records] == [None, None]
    assert [(r.output_tokens, r.tokens_from) for r in state.records] == [(count, source)] * 2
    assert all(s.headers["X-A"] == "1" for s in recorder.seen)


async def test_a_bad_header_or_a_key_twice_is_a_usage_error() -> None:
    bad = await asyncio.to_thread(
        _loadtest, "--url", "http://127.0.0.1:1", "--requests", "1", "--header", "nocolon"
    )
    twice = await asyncio.to_thread(
        _loadtest, "--url", "http://127.0.0.1:1", "--requests", "1",
        "--api-key", "k", "--header", "Authorization: Basic x",
    )  # fmt: skip
    assert (bad.returncode, twice.returncode) == (2, 2)
    assert "--header 'nocolon': expected 'Name: value'" in bad.stderr
    assert "Authorization --header" in twice.stderr
