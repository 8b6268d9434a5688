"""`python -m loadtest` end to end in a subprocess, against a simulated units subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT, SimProcess, start_sim, stop_process

SUMMARY_KEYS = {
    "requests",
    "succeeded",
    "failed",
    "ended_in_grace",
    "cut",
    "wall_s",
    "request_throughput_rps",
    "output_token_throughput_tps",
    "output_tokens",
    "errors",
    "ttft_ms",
    "itl_ms",
    "tpot_ms",
    "e2e_ms",
    "goodput",
    "lengths",
    "output_tokens_from",
}
RECORD_KEYS = {
    "index",
    "scheduled_ms",
    "session_id",
    "input_words",
    "max_tokens",
    "status",
    "error",
    "ttft_ms",
    "e2e_ms",
    "tpot_ms",
    "itl_mean_ms",
    "output_tokens",
    "prompt_tokens",
    "input_tokens",
    "output_tokens_from",
    "ended",
}


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("gen-sim")
    process: SimProcess = start_sim(
        tmp, "--units", "1", "--followers", "0", "--ttft-ms", "5", "--itl-ms", "2", "--tokens", "8"
    )
    yield str(process.units[0]["leader"])
    stop_process(process.proc)


def _loadtest(*args: str) -> subprocess.CompletedProcess[str]:
    """Output decoded by hand: text mode would turn the progress line's \r into \n."""
    done = subprocess.run(
        [sys.executable, "-m", "loadtest", *args], cwd=ROOT, capture_output=True, timeout=60
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def test_cli_runs_and_writes_result_json(leader: str, tmp_path: Path) -> None:
    done = _loadtest(
        "--url", leader, "--concurrency", "3", "--requests", "12", "--max-tokens", "4",
        "--session-share", "0.5", "--slo-ttft-ms", "1000", "--slo-tpot-ms", "1000",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "TTFT" in done.stdout and "goodput 12 requests" in done.stdout
    assert "PASS  error_rate 0 (0 of 12 failed) <= 0" in done.stdout
    assert "output tokens counted from: server usage 12" in done.stdout
    model, log = done.stderr.split("\n", 1)  # no --model: the one /v1/models lists
    assert model == "model: unitgate-sim (the one listed at /v1/models)"
    assert log.startswith("[") and "done 12" in log  # a log: whole lines
    result = json.loads((tmp_path / "result.json").read_text())
    assert set(result) == {"config", "summary", "requests", "checks"}
    assert result["config"]["shape"] == "closed"
    assert result["config"]["model"] == "unitgate-sim"
    assert [c["passed"] for c in result["checks"]] == [True]
    assert result["config"]["output_len"] == "4"  # --max-tokens is an alias of --output-len
    summary = result["summary"]
    assert set(summary) == SUMMARY_KEYS
    assert summary["succeeded"] == 12 and summary["output_tokens"] == 48
    assert set(summary["ttft_ms"]) == {"count", "mean", "p50", "p90", "p99", "max"}
    assert len(result["requests"]) == 12
    assert all(set(r) == RECORD_KEYS for r in result["requests"])
    assert any(r["session_id"] for r in result["requests"])


def test_cli_open_loop(leader: str) -> None:
    done = _loadtest(
        "--url", leader, "--model", "unitgate-sim", "--rate", "50", "--duration", "0.6",
        "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "errors: none" in done.stdout
    assert done.stderr == ""


def test_cli_fails_a_run_where_every_request_failed(tmp_path: Path) -> None:
    """A closed port: every request is refused, the report says so and the exit status is 1."""
    done = _loadtest(
        "--url", "http://127.0.0.1:1", "--model", "m", "--requests", "2", "--out", str(tmp_path)
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "connection_refused 2" in done.stdout
    assert "FAIL  error_rate 1 (2 of 2 failed) > 0  (--max-error-rate 0)" in done.stdout
    assert done.stdout.rstrip().endswith(f"result: {tmp_path / 'result.json'}")
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["summary"]["errors"] == {"connection_refused": 2}
    assert result["checks"][0]["passed"] is False and result["checks"][0]["observed"] == 1.0


def test_cli_without_a_model_needs_the_target_to_list_one() -> None:
    done = _loadtest("--url", "http://127.0.0.1:1", "--requests", "2")
    assert done.returncode == 3
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "unitgate loadtest: cannot list models at http://127.0.0.1:1/v1/models: "
        "connection_refused; give the model with --model"
    )


@pytest.mark.parametrize(
    "args",
    [
        ("--url", "127.0.0.1:8080", "--requests", "1"),
        ("--url", "http://x", "--concurrency", "2"),
        ("--url", "http://x", "--requests", "1", "--rate", "1", "--concurrency", "1"),
        ("--url", "http://x", "--requests", "0"),
        ("--url", "http://x", "--requests", "1", "--prompts", "/nonexistent.jsonl"),
        ("--url", "http://x", "--requests", "1", "--slo", "ttft_p99=2"),
        ("--url", "http://x", "--requests", "1", "--max-error-rate", "2"),
        ("--url", "http://x", "--requests", "1", "--tokenizer", "/nonexistent"),
        ("--url", "http://x", "--requests", "1", "--endpoint", "embeddings"),
        ("--url", "http://x", "--requests", "1", "--prompt-tokens", "5", "--input-len", "5"),
    ],
)
def test_cli_rejects_bad_options_with_a_message(args: tuple[str, ...]) -> None:
    done = _loadtest(*args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and done.stderr.strip()
