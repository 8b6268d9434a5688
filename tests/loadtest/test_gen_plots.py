"""PNG charts drawn from synthetic result.json documents, with and without a time series."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from loadtest.gen import cli, plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _record(i: int, ok: bool = True) -> dict[str, object]:
    return {
        "index": i,
        "scheduled_ms": i * 10.0,
        "error": None if ok else "http_500",
        "ttft_ms": 5.0 + i if ok else None,
        "e2e_ms": 20.0 + 2 * i if ok else None,
        "tpot_ms": 2.0 + i / 10 if ok else None,
        "itl_mean_ms": 2.0 + i / 10 if ok else None,
        "output_tokens": 8 if ok else 0,
    }


def synthetic_result(timeseries: bool, actions: bool = True) -> dict[str, object]:
    result: dict[str, object] = {
        "config": {"shape": "closed"},
        "summary": {"requests": 21, "failed": 1},
        "requests": [_record(i) for i in range(20)] + [_record(20, ok=False)],
    }
    if timeseries:
        result["timeseries"] = [
            {"t": s, "started": 5, "completed": 4 + s % 2, "failed": s // 3,
             "output_tokens": 40 + s, "ttft_p50_ms": 5.0, "ttft_p99_ms": 9.0}
            for s in range(6)
        ]  # fmt: skip
    if actions:
        result["actions"] = [{"at": 2.0, "kind": "drain"}, {"at": 4.5, "kind": "kill"}]
    return result


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > 5000, path  # axes, labels and a curve, not an empty canvas


def test_latency_cdf_only_without_a_timeseries(tmp_path: Path) -> None:
    written = plots.write_plots(synthetic_result(timeseries=False), tmp_path)
    assert [p.name for p in written] == ["latency_cdf.png"]
    assert_png(tmp_path / "latency_cdf.png")
    assert not (tmp_path / "throughput.png").exists()


@pytest.mark.parametrize("actions", [True, False])
def test_timeseries_charts_with_and_without_actions(tmp_path: Path, actions: bool) -> None:
    written = plots.write_plots(synthetic_result(timeseries=True, actions=actions), tmp_path)
    assert sorted(p.name for p in written) == ["errors.png", "latency_cdf.png", "throughput.png"]
    for path in written:
        assert_png(path)


def test_timeseries_in_the_bucket_document_form(tmp_path: Path) -> None:
    """The shape timeseries.py writes: {"bucket_s": 1, "buckets": [{"t_s": ...}, ...]}."""
    result = synthetic_result(timeseries=True)
    buckets = [{**b, "t_s": b.pop("t")} for b in result["timeseries"]]  # type: ignore[attr-defined]
    result["timeseries"] = {"bucket_s": 1.0, "buckets": buckets}
    assert len(plots.write_plots(result, tmp_path)) == 3
    assert_png(tmp_path / "errors.png")


def test_no_samples_still_draws(tmp_path: Path) -> None:
    result = {"summary": {}, "requests": [_record(0, ok=False)], "timeseries": {"buckets": []}}
    assert [p.name for p in plots.write_plots(result, tmp_path)] == ["latency_cdf.png"]
    assert_png(tmp_path / "latency_cdf.png")


def test_plot_subcommand_redraws_from_result_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "result.json").write_bytes(orjson.dumps(synthetic_result(timeseries=True)))
    assert cli.main(["plot", str(tmp_path)]) == 0
    assert "throughput.png" in capsys.readouterr().out
    for name in ("latency_cdf.png", "throughput.png", "errors.png"):
        assert_png(tmp_path / name)
    elsewhere = tmp_path / "charts"
    assert cli.main(["plot", str(tmp_path / "result.json"), "--out", str(elsewhere)]) == 0
    assert_png(elsewhere / "errors.png")


def test_plot_subcommand_reports_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "result.json").write_text("{not json")
    assert cli.main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "Traceback" not in err


def test_missing_matplotlib_is_a_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert plots.try_write_plots(synthetic_result(timeseries=True), tmp_path) == []
    assert "unitgate[loadtest]" in capsys.readouterr().err
    (tmp_path / "result.json").write_bytes(orjson.dumps(synthetic_result(timeseries=False)))
    assert plots.main([str(tmp_path)]) == 2
    assert "matplotlib is not installed" in capsys.readouterr().err
