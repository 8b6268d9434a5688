"""`compare` on two synthetic results: headline values, B/A ratios, table and JSON output."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from loadtest.gen import cli
from loadtest.gen.compare import compare, compare_table, headline


def _dist(p50: float, p99: float) -> dict[str, object]:
    return {"count": 10, "mean": p50, "p50": p50, "p90": p99, "p99": p99, "max": p99}


def summary(scale: float, failed: int) -> dict[str, object]:
    return {
        "requests": 100,
        "succeeded": 100 - failed,
        "failed": failed,
        "request_throughput_rps": 10.0 * scale,
        "output_token_throughput_tps": 80.0 * scale,
        "ttft_ms": _dist(5.0 * scale, 9.0 * scale),
        "itl_ms": _dist(2.0, 4.0),
        "tpot_ms": _dist(2.0, 3.0),
        "e2e_ms": _dist(20.0, 40.0),
        "goodput": {"rps": 9.0 * scale, "requests": 90, "fraction": 0.9},
    }


def test_headline_picks_the_metrics_and_derives_the_error_rate() -> None:
    h = headline(summary(1.0, failed=4))
    assert h["req/s"] == 10.0 and h["tok/s"] == 80.0
    assert h["TTFT p50 ms"] == 5.0 and h["TTFT p99 ms"] == 9.0
    assert h["E2E p99 ms"] == 40.0
    assert h["error rate"] == pytest.approx(0.04)
    assert h["goodput req/s"] == 9.0


def test_ratios_are_b_over_a_and_undefined_on_zero_or_missing() -> None:
    a = {"summary": summary(1.0, failed=0)}
    b = {"summary": summary(2.0, failed=5)}
    b["summary"]["itl_ms"] = {"count": 0, "p50": None, "p99": None}  # type: ignore[index]
    rows = {r["metric"]: r for r in compare(a, b)}
    assert rows["req/s"]["ratio"] == 2.0
    assert rows["TTFT p99 ms"]["ratio"] == 2.0
    assert rows["E2E p50 ms"]["ratio"] == 1.0
    assert rows["ITL p50 ms"]["b"] is None and rows["ITL p50 ms"]["ratio"] is None
    assert rows["error rate"]["a"] == 0.0 and rows["error rate"]["ratio"] is None
    table = compare_table(list(rows.values()), ["direct", "gateway"])
    assert "gateway/direct" in table.splitlines()[0]
    assert any(line.startswith("req/s") and line.endswith("2.000") for line in table.splitlines())


def test_compare_subcommand_prints_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, scale in (("a", 1.0), ("b", 0.5)):
        (tmp_path / name).mkdir()
        doc = {"config": {}, "summary": summary(scale, failed=0), "requests": []}
        (tmp_path / name / "result.json").write_bytes(orjson.dumps(doc))
    out = tmp_path / "cmp.json"
    args = [str(tmp_path / "a" / "result.json"), str(tmp_path / "b")]  # a file or its directory
    assert cli.main(["compare", *args, "--names", "direct", "gateway", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "direct" in printed and "gateway/direct" in printed and "0.500" in printed
    doc = json.loads(out.read_text())
    assert doc["names"] == ["direct", "gateway"]
    assert {r["metric"]: r["ratio"] for r in doc["rows"]}["tok/s"] == 0.5


def test_compare_subcommand_rejects_a_non_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "x.json").write_text('{"hello": 1}')
    assert cli.main(["compare", str(tmp_path / "x.json"), str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert "not a loadtest result" in err and "Traceback" not in err
