"""Pure parts of the load generator: percentiles, SLO checks, workloads, prompt files."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from loadtest.gen.client import RequestRecord
from loadtest.gen.stats import Slo, aggregate, distribution, meets_slo, percentile
from loadtest.gen.workload import (
    SHOPPING_PROMPTS,
    Workload,
    WorkloadConfig,
    WorkloadError,
    load_jsonl,
    pad_words,
)


def test_percentile_is_nearest_rank_on_exact_samples() -> None:
    ordered = [float(v) for v in range(1, 101)]
    assert percentile(ordered, 50) == 50.0
    assert percentile(ordered, 99) == 99.0
    assert percentile(ordered, 100) == 100.0
    assert percentile([7.0], 99) == 7.0


def test_distribution_reports_milliseconds_and_empty_as_none() -> None:
    dist = distribution([0.001, 0.002, 0.003])
    assert dist["count"] == 3
    assert dist["mean"] == pytest.approx(2.0)
    assert dist["max"] == pytest.approx(3.0)
    assert distribution([])["p99"] is None


def _record(ttft: float, e2e: float, tokens: int, error: str | None = None) -> RequestRecord:
    return RequestRecord(0, 0.0, ttft=ttft, e2e=e2e, output_tokens=tokens, error=error)


def test_goodput_needs_success_and_every_given_slo() -> None:
    fast = _record(0.01, 0.1, 10)  # tpot 10 ms
    slow_decode = _record(0.01, 0.5, 10)  # tpot ~54 ms
    failed = _record(0.01, 0.1, 10, error="http_500")
    slo = Slo(ttft_ms=20, tpot_ms=20)
    assert meets_slo(fast, slo)
    assert not meets_slo(slow_decode, slo)
    assert not meets_slo(failed, slo)
    summary = aggregate([fast, slow_decode, failed], 1.0, slo)
    assert summary["goodput"] == {
        "slo": {"ttft_ms": 20, "tpot_ms": 20},
        "requests": 1,
        "rps": 1.0,
        "fraction": pytest.approx(1 / 3),
    }
    assert summary["errors"] == {"http_500": 1}


def test_workload_body_asks_for_stream_usage_and_output_length() -> None:
    work = Workload(WorkloadConfig("m", max_tokens=7, session_share=0.0))
    spec = work.next_request()
    body = orjson.loads(spec.body)
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 7
    assert body["messages"][0]["content"] in SHOPPING_PROMPTS
    assert spec.session_id is None


def test_session_share_is_honoured_and_seeded() -> None:
    config = WorkloadConfig("m", session_share=0.3, sessions=4, seed=3)
    first, second = Workload(config), Workload(config)
    assert [first.next_request() for _ in range(20)] == [second.next_request() for _ in range(20)]
    work = Workload(config)
    sessions = [work.next_request().session_id for _ in range(2000)]
    used = [s for s in sessions if s is not None]
    assert 0.25 < len(used) / len(sessions) < 0.35
    assert len(set(used)) == 4


def test_input_words_pads_and_cuts() -> None:
    assert len(pad_words("a b c", 10).split()) == 10
    assert pad_words("a b c d", 2) == "a b"
    work = Workload(WorkloadConfig("m", input_words=50))
    content = orjson.loads(work.next_request().body)["messages"][0]["content"]
    assert len(content.split()) == 50


def test_jsonl_prompts_accept_prompt_and_messages(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    lines = [
        orjson.dumps({"prompt": "one"}),
        b"",
        orjson.dumps({"messages": [{"role": "user", "content": "two"}]}),
    ]
    path.write_bytes(b"\n".join(lines))
    assert load_jsonl(path) == ["one", "two"]


@pytest.mark.parametrize("content", [b"not json\n", b'{"text": 1}\n', b""])
def test_bad_jsonl_is_a_workload_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(WorkloadError):
        load_jsonl(path)
    with pytest.raises(WorkloadError):
        load_jsonl(tmp_path / "missing.jsonl")
