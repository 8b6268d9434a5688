"""Scenario parsing, the time series and failover: pure functions, no sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.gen.client import RequestRecord
from loadtest.gen.scenario import (
    AdminAction,
    ScenarioError,
    SignalAction,
    SimFaultAction,
    load_scenario,
    parse_scenario,
)
from loadtest.gen.timeseries import failover, timeseries

EXAMPLE = """
[[actions]]
at = 5
signal = "kill"
health_url = "http://127.0.0.1:8102"

[[actions]]
at = 1.5
admin = "disable"
unit = "u0"

[[actions]]
at = 9
sim_fault = { control = "http://127.0.0.1:9000", unit = "u1", mode = "error", status = 503 }
"""


def test_example_file_parses_sorted_with_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNITGATE_ADMIN_TOKEN", "s3cret")
    path = tmp_path / "s.toml"
    path.write_text(EXAMPLE)
    actions = load_scenario(path)
    assert [(a.index, a.at) for a in actions] == [(1, 1.5), (0, 5.0), (2, 9.0)]
    assert actions[0].kind == AdminAction(
        "disable", "u0", "loadtest scenario", "http://127.0.0.1:8081", "s3cret"
    )
    assert actions[1].kind == SignalAction("kill", None, "http://127.0.0.1:8102")
    assert actions[2].kind == SimFaultAction(
        "http://127.0.0.1:9000", "u1", {"mode": "error", "status": 503}
    )
    assert [a.kind_name for a in actions] == ["admin", "signal", "sim_fault"]


def _one(**entry: object) -> dict[str, object]:
    return {"actions": [{"at": 1, "admin": "enable", "unit": "u0"}, entry]}


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        (_one(at=2, signal="hup", pid=42), "actions[1].signal"),
        (_one(at=-1, signal="kill", pid=42), "actions[1].at"),
        (_one(at="soon", signal="kill", pid=42), "actions[1].at"),
        (_one(at=1, signal="kill"), "actions[1]: give exactly one of pid and health_url"),
        (_one(at=1, signal="kill", pid=1), "actions[1].pid"),
        (_one(at=1, signal="kill", health_url="localhost:1"), "actions[1].health_url"),
        (_one(at=1, admin="pause", unit="u0"), "actions[1].admin"),
        (_one(at=1, admin="drain"), "actions[1].unit"),
        (_one(at=1, admin="drain", unit="u0", pid=3), "actions[1].pid"),
        (_one(at=1, admin="drain", unit="u0", admin_url="ftp://x"), "actions[1].admin_url"),
        (_one(at=1, admin="drain", unit="u0", signal="kill"), "actions[1]: give exactly one"),
        (_one(at=1), "actions[1]: give exactly one"),
        (_one(at=1, sim_fault={"control": "http://x", "unit": "u0"}), "actions[1].sim_fault.mode"),
        ({"actions": []}, "actions: give at least one"),
        ({"action": []}, "unknown key 'action'"),
        ({"actions": [3]}, "actions[0]: must be a table"),
    ],
)
def test_scenario_errors_name_the_key(raw: dict[str, object], names: str) -> None:
    with pytest.raises(ScenarioError, match=names.replace("[", r"\[").replace("]", r"\]")):
        parse_scenario(raw)


def test_unreadable_or_bad_toml_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("[[actions]\nat = ")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        load_scenario(tmp_path / "bad.toml")


def _series(*rows: tuple[int, int]) -> list[dict[str, object]]:
    """(completed, failed) per second."""
    return [{"t_s": float(i), "completed": c, "failed": f} for i, (c, f) in enumerate(rows)]


def test_failover_ends_at_the_first_clean_bucket_after_failures() -> None:
    series = _series((10, 0), (10, 0), (4, 6), (0, 9), (0, 3), (8, 0), (10, 1), (10, 0))
    # The action's own bucket (1) is clean: errors of a fault often show up a bit later.
    assert failover(series, 1.5) == (3.5, 18)
    assert failover(series, 0.0) == (5.0, 18)
    assert failover(series, 6.2) == (0.8, 1)  # bucket 6 includes failures from before 6.2


def test_failover_with_no_failures_or_no_recovery() -> None:
    assert failover(_series((5, 0), (5, 0)), 0.5) == (0.0, 0)
    # A clean bucket needs completions: a silent second is not a recovery.
    assert failover(_series((5, 0), (0, 4), (0, 0), (0, 2)), 0.5) == (None, 6)
    assert failover([], 3.0) == (0.0, 0)


def _record(index: int, scheduled: float, error: str | None = None) -> RequestRecord:
    r = RequestRecord(index=index, scheduled=scheduled, error=error)
    if error is None:
        r.ttft, r.e2e, r.output_tokens = 0.3, 0.9, 6
        r.token_times = [scheduled + 0.3, scheduled + 0.6, scheduled + 0.9]
    return r


def test_timeseries_buckets_by_start_end_and_first_token() -> None:
    records = [
        _record(0, 0.2),
        _record(1, 0.8),
        _record(2, 1.5, "http_500"),
        _record(3, 1.9, "timeout"),
        _record(4, 2.1),
    ]
    ends = {0: 1.1, 1: 1.7, 2: 1.55, 3: 3.4, 4: 3.0}
    buckets = timeseries(records, ends, wall_s=3.4)["buckets"]
    assert isinstance(buckets, list) and len(buckets) == 4
    assert [b["started"] for b in buckets] == [2, 2, 1, 0]
    assert [b["completed"] for b in buckets] == [0, 2, 0, 1]
    assert [b["failed"] for b in buckets] == [0, 1, 0, 1]
    assert [b["errors"] for b in buckets] == [{}, {"http_500": 1}, {}, {"timeout": 1}]
    # Tokens land when they streamed (6 tokens in 3 chunks): record 0 at 0.5, 0.8 and 1.1.
    assert [b["output_tokens"] for b in buckets] == [4.0, 8.0, 4.0, 2.0]
    assert [b["ttft_p50_ms"] for b in buckets] == [300.0, 300.0, 300.0, None]
    assert [b["e2e_p50_ms"] for b in buckets] == [None, 900.0, None, 900.0]
    assert timeseries([], {}, 0.0)["buckets"] == []
