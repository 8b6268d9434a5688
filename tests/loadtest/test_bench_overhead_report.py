"""The overhead benchmark's report: the aims' ratios and their room above the floor relay."""

from __future__ import annotations

import math

import pytest

from loadtest.bench.overhead import report
from loadtest.bench.overhead.load import Run
from loadtest.bench.overhead.params import CONCURRENCIES, ITLS_MS, MODES, PEERS, PYTHON_MODES
from loadtest.bench.processes import CLK_TCK

COMPLETED = 1000
# CPU us per request by relay, at every point.
CPU_US = {
    "floor": 600.0,
    "gateway-plain": 800.0,
    "gateway": 900.0,
    "nginx": 700.0,
    "vllm-router": 800.0,
    "gateway-py": 1000.0,
    "gateway-plain-py": 950.0,
}


def _run(mode: str, itl: float, c: int) -> Run:
    ticks = None
    if mode != "direct":
        ticks = CPU_US[mode] * COMPLETED * CLK_TCK / 1e6
        assert ticks == int(ticks)
    return Run(
        mode, itl, c, COMPLETED, COMPLETED, 0, 1.0,
        None if ticks is None else int(ticks), [1.0, 2.0, 3.0],
    )  # fmt: skip


def _runs(modes: tuple[str, ...]) -> list[Run]:
    return [_run(m, itl, c) for itl in ITLS_MS for c in CONCURRENCIES for m in modes]


def test_every_point_gets_the_aims_room_above_the_floor() -> None:
    table = report.rows(_runs((*MODES, *PEERS, *PYTHON_MODES)))
    assert len(table) == len(ITLS_MS) * len(CONCURRENCIES)
    for row in table:
        assert row["floor_cpu_us_per_request"] == pytest.approx(600.0)
        assert row["gateway_router_cpu_ratio"] == pytest.approx(900 / 800)
        assert row["plain_nginx_cpu_ratio"] == pytest.approx(800 / 700)
        assert row["router_aim_room_us"] == pytest.approx(0.9 * 800 - 600)
        assert row["nginx_aim_room_us"] == pytest.approx(700 - 600)
        assert row["gateway_above_floor_us"] == pytest.approx(300.0)
        assert row["plain_above_floor_us"] == pytest.approx(200.0)


def test_without_the_peers_the_room_is_not_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    table = report.rows(_runs((*MODES, *PYTHON_MODES)))
    for row in table:
        assert math.isnan(row["router_aim_room_us"]) and math.isnan(row["nginx_aim_room_us"])
        assert row["gateway_above_floor_us"] == pytest.approx(300.0)
    report.print_room(table)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("ITL ms") and "room under the resumable aim" in lines[0]
    assert lines[1].split() == ["0", "32", "600", "nan", "300", "nan", "200"]


def test_the_printed_room_is_each_points(capsys: pytest.CaptureFixture[str]) -> None:
    report.print_room(report.rows(_runs((*MODES, *PEERS, *PYTHON_MODES))))
    out = capsys.readouterr().out.strip().splitlines()
    cells = [line.split() for line in out[1:5]]
    assert [c[:2] for c in cells] == [["0", "32"], ["0", "128"], ["20", "32"], ["20", "128"]]
    assert all(c[2:] == ["600", "120", "300", "100", "200"] for c in cells)
    assert "does nothing per request" in out[-1]


def test_the_other_tables_print_a_line_per_point(capsys: pytest.CaptureFixture[str]) -> None:
    table = report.rows(_runs((*MODES, *PEERS, *PYTHON_MODES)))
    report.print_table(table)
    report.print_relays(table)
    lines = capsys.readouterr().out.splitlines()
    main = [line.split() for line in lines[1:5]]
    assert [c[:2] for c in main] == [["0", "32"], ["0", "128"], ["20", "32"], ["20", "128"]]
    relays = [line.split() for line in lines[8:12]]  # after the note and a blank line
    assert all(c[2:5] == ["700", "800", "600"] for c in relays)  # nginx, router, floor
    assert all("1.12 (<=0.9 MISS)" in line for line in lines[8:12])
