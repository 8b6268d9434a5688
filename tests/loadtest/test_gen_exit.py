"""`unitgate loadtest`'s exit status and token lengths, end to end: the CLI in a subprocess
against simulated units behind a real gateway (in this process), on real sockets."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.server import Gateway, running
from tests.loadtest.openai_recorder import word_tokenizer_folder
from tests.support import ROOT, SimProcess, gateway_config


@pytest.fixture
async def gateway(clean_sim: SimProcess) -> AsyncIterator[Gateway]:
    async with running(gateway_config(clean_sim.units)) as gw:
        yield gw


async def _loadtest(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "loadtest", "--no-progress", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _result(out: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result


async def test_a_model_the_gateway_does_not_serve_fails_the_run(
    gateway: Gateway, tmp_path: Path
) -> None:
    url = gateway.public_url
    done = await _loadtest(
        "--url", url, "--model", "nope", "--requests", "3", "--out", str(tmp_path)
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "errors: http_404 3" in done.stdout
    assert "FAIL  error_rate 1 (3 of 3 failed) > 0" in done.stdout
    assert _result(tmp_path)["summary"]["errors"] == {"http_404": 3}


async def test_slos_pass_and_fail_through_the_gateway(gateway: Gateway, tmp_path: Path) -> None:
    """The simulated units answer in about 5 ms to the first token and 20 ms in all."""
    url, common = gateway.public_url, ("--concurrency", "2", "--requests", "6", "--max-tokens", "8")
    met = await _loadtest(
        "--url", url, *common, "--slo", "ttft_p99=2s", "--slo", "itl_p50=500ms",
        "--slo", "duration_p50=5s", "--slo", "error_rate=0%", "--out", str(tmp_path),
    )  # fmt: skip
    assert met.returncode == 0, met.stdout + met.stderr
    assert "model: unitgate-sim (the one listed at /v1/models)" in met.stderr
    assert "checks: all passed" in met.stdout
    checks = _result(tmp_path)["checks"]
    metrics = ["error_rate", "ttft_p99", "itl_p50", "e2e_p50", "error_rate"]
    assert [c["metric"] for c in checks] == metrics
    assert checks[0]["check"] == "--max-error-rate 0" and all(c["passed"] for c in checks)
    missed = await _loadtest("--url", url, *common, "--slo", "ttft_p50=1ms", "--slo", "e2e_p99=9s")
    assert missed.returncode == 1, missed.stdout + missed.stderr
    lines = missed.stdout.splitlines()
    failed = [line for line in lines if line.startswith("  FAIL")]
    assert (
        len(failed) == 1 and "ttft_p50" in failed[0] and "> 1 ms  (--slo ttft_p50=1ms)" in failed[0]
    )
    assert "checks: 1 of 3 failed" in lines


@pytest.mark.parametrize("stream", [True, False])
async def test_the_completions_endpoint_through_the_gateway(
    gateway: Gateway, stream: bool, tmp_path: Path
) -> None:
    flags = () if stream else ("--no-stream",)
    done = await _loadtest(
        "--url", gateway.public_url, "--endpoint", "completions", "--requests", "4",
        "--max-tokens", "5", *flags, "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = _result(tmp_path)["summary"]
    assert summary["succeeded"] == 4 and summary["output_tokens"] == 20
    assert summary["output_tokens_from"] == {"usage": 4}
    assert summary["ttft_ms"]["count"] == (4 if stream else 0)


async def test_prompts_of_exactly_n_tokens_with_a_tokenizer_folder(
    clean_sim: SimProcess, tmp_path: Path
) -> None:
    """The simulator counts a prompt's words as its tokens, as the word tokenizer does, so
    the server's count must equal what was sent."""
    folder = word_tokenizer_folder(tmp_path / "tok")
    done = await _loadtest(
        "--url", clean_sim.units[0]["leader"], "--requests", "5", "--prompt-tokens",
        "uniform:20:60", "--tokenizer", str(folder), "--max-tokens", "8", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"prompt tokens sent: exact, tokenizer {folder / 'tokenizer.json'}" in done.stdout
    result = _result(tmp_path)
    assert result["config"]["prompt_tokens"] == "uniform:20:60"
    records = result["requests"]
    assert all(20 <= r["input_tokens"] <= 60 for r in records)
    assert [r["prompt_tokens"] for r in records] == [r["input_tokens"] for r in records]
    assert len({r["input_tokens"] for r in records}) > 1


async def test_prompt_tokens_without_a_tokenizer_are_approximate_and_say_so(
    clean_sim: SimProcess, tmp_path: Path
) -> None:
    done = await _loadtest(
        "--url", clean_sim.units[0]["leader"], "--requests", "2", "--prompt-tokens", "40",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "prompt tokens sent: APPROXIMATE, no tokenizer known for this model" in done.stdout
    records = _result(tmp_path)["requests"]
    assert [(r["input_tokens"], r["input_words"]) for r in records] == [(None, 30)] * 2
