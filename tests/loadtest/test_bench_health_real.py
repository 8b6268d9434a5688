"""The health benchmark's part on make run's units: its pure pieces (the config's ports moved,
the ports it reads back, the reasons it reads from the log, the report's rows)."""

from __future__ import annotations

import re
from pathlib import Path

from loadtest.bench.health import report
from loadtest.bench.health.real import REASON, RealTrials, Run, _ports, moved_ports

ROOT = Path(__file__).resolve().parents[2]


def test_every_port_of_the_config_moves_and_the_same_port_moves_the_same_way() -> None:
    text = (ROOT / "config.toml").read_text()
    moved, ports = moved_ports(text)
    before = set(re.findall(r"127\.0\.0\.1:(\d+)", text))
    after = set(re.findall(r"127\.0\.0\.1:(\d+)", moved))
    assert before and not before & after and len(after) == len(before)
    assert {str(p) for p in ports.values()} >= after and set(map(str, ports)) >= before
    assert "redis://127.0.0.1:" in moved  # moved too: no redis runs for a single gateway
    url, metrics, follower = _ports(moved)
    assert url != metrics and f"127.0.0.1:{follower}" in moved
    u0 = moved[moved.index('id = "u0"') : moved.index('id = "u1"')]
    assert f":{follower}" in u0 and f':{follower}"]' in u0  # u0's last node: its follower


def test_the_reason_is_the_probers_or_the_breakers() -> None:
    log = (
        "x unit u1: unhealthy (other) by prober\n"
        "x unit u0: breaker ejected (5 consecutive failures) by breaker\n"
        "x unit u0: unhealthy (node 1 (follower http://h:1): no answer) by prober\n"
    )
    found = REASON.findall(log)
    assert [(what, by) for what, _, by in found] == [
        ("breaker ejected", "breaker"),
        ("unhealthy", "prober"),
    ]


def test_the_rows_judge_each_faults_worst_run_against_one_second() -> None:
    trials = RealTrials(runs=[Run("freeze", 0.6, 0.5, "p"), Run("freeze", 1.2, 1.1, "p")])
    misses: list[str] = []
    [row] = report.real_rows(trials, misses)  # no kill run: no kill row
    assert row[0].startswith("SIGSTOP") and row[-1] == "MISS" and misses
    trials.runs[1] = Run("freeze", 0.9, 0.8, "p")
    misses.clear()
    assert report.real_rows(trials, misses)[0][-1] == "ok" and not misses
