"""The overhead benchmark's report: the resumable gateway's CPU above the floor relay against
its allowance, TTFT p99 against vllm-router's, and the peers' ratios for information."""

from __future__ import annotations

import math
import re
from pathlib import Path

import orjson
import pytest

from loadtest.bench.overhead import report
from loadtest.bench.overhead.load import Run
from loadtest.bench.overhead.params import CONCURRENCIES, ITLS_MS, MODES, PEERS, PYTHON_MODES
from loadtest.bench.processes import CLK_TCK

ALL = (*MODES, *PEERS, *PYTHON_MODES)
COMPLETED = 1000
# CPU us per request by relay, at every point: the gateway 300 us above the floor, over the
# 150 us allowed at 0 ms and under the 600 us allowed at 20 ms.
CPU_US = {
    "floor": 600.0,
    "gateway-plain": 800.0,
    "gateway": 900.0,
    "nginx": 700.0,
    "vllm-router": 800.0,
    "gateway-py": 1000.0,
    "gateway-plain-py": 950.0,
}
TTFT_MS = [1.0, 2.0, 3.0]


def _run(mode: str, itl: float, c: int, cpu_us: dict[str, float], ttft: list[float]) -> Run:
    ticks = None
    if mode != "direct":
        ticks = cpu_us[mode] * COMPLETED * CLK_TCK / 1e6
        assert ticks == int(ticks)
    return Run(
        mode, itl, c, COMPLETED, COMPLETED, 0, 1.0, None if ticks is None else int(ticks), ttft
    )


def _runs(
    modes: tuple[str, ...],
    cpu_us: dict[str, float] | None = None,
    ttft: dict[str, list[float]] | None = None,
    itls: tuple[float, ...] = ITLS_MS,
) -> list[Run]:
    cpu, ttfts = CPU_US | (cpu_us or {}), ttft or {}
    return [
        _run(m, itl, c, cpu, ttfts.get(m, TTFT_MS))
        for itl in itls
        for c in CONCURRENCIES
        for m in modes
    ]


def _printed(
    capsys: pytest.CaptureFixture[str], table: list[dict[str, float]]
) -> tuple[list[str], list[str]]:
    """The main table's and the relays table's lines: header, a line per point, the note."""
    report.print_table(table)
    report.print_relays(table)
    lines = capsys.readouterr().out.splitlines()
    n = len(table)
    assert lines[n + 2] == ""
    return lines[: n + 2], lines[n + 3 :]


def _cells(lines: list[str]) -> list[dict[str, str]]:
    """An aligned table's points as {column: cell}: columns are two or more spaces apart."""
    header, *points = (re.split(r" {2,}", line.strip()) for line in lines)
    return [dict(zip(header, cells, strict=True)) for cells in points]


def test_every_point_gets_the_gateways_cpu_above_the_floor_against_its_allowance() -> None:
    table = report.rows(_runs(ALL))
    assert len(table) == len(ITLS_MS) * len(CONCURRENCIES)
    for row in table:
        assert row["floor_cpu_us_per_request"] == pytest.approx(600.0)
        assert row["gateway_above_floor_us"] == pytest.approx(300.0)
        assert row["plain_above_floor_us"] == pytest.approx(200.0)
        aim = {0.0: 150.0, 20.0: 600.0}[row["itl_ms"]]
        assert row["above_floor_aim_us"] == aim
        assert row["meets_above_floor_aim"] is (row["itl_ms"] == 20.0)
        # The peers' ratios stay, for information; the old aims' room above the floor is gone.
        assert row["gateway_router_cpu_ratio"] == pytest.approx(900 / 800)
        assert row["plain_nginx_cpu_ratio"] == pytest.approx(800 / 700)
        assert not {"router_aim_room_us", "nginx_aim_room_us"} & row.keys()


def test_the_allowance_is_inclusive_and_judged_at_every_concurrency() -> None:
    # 150 above the floor at 0 ms is within its aim; 610 at 20 ms is over its 600.
    table = report.rows(_runs(ALL, {"gateway": 750.0, "floor": 600.0}))
    assert [r["meets_above_floor_aim"] for r in table] == [True, True, True, True]
    table = report.rows(_runs(ALL, {"gateway": 1210.0}))
    assert [(r["itl_ms"], r["concurrency"], r["meets_above_floor_aim"]) for r in table] == [
        (0.0, 32, False),
        (0.0, 128, False),
        (20.0, 32, False),
        (20.0, 128, False),
    ]
    assert table[2]["gateway_above_floor_us"] == pytest.approx(610.0)


def test_the_main_table_prints_the_floor_aims_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    main, _ = _printed(capsys, report.rows(_runs(ALL)))
    assert "gw above floor us (aim)" in main[0] and "target" not in main[0]
    points = _cells(main[:5])
    assert [(p["ITL ms"], p["c"], p["gw CPU us/req"]) for p in points] == [
        ("0", "32", "900"),
        ("0", "128", "900"),
        ("20", "32", "900"),
        ("20", "128", "900"),
    ]
    assert [p["gw above floor us (aim)"] for p in points] == [
        "300 (<=150 MISS)",
        "300 (<=150 MISS)",
        "300 (<=600 ok)",
        "300 (<=600 ok)",
    ]
    assert all(p["plain above floor us"] == "200" for p in points)
    note = main[-1]
    assert "floor + 150 us at 0 ms ITL and floor + 600 us at 20 ms ITL" in note
    assert "TTFT p99 no worse than vllm-router's" in note
    assert "0.9" not in note and "400" not in note and "1500" not in note


def test_an_itl_without_an_aim_gets_no_verdict(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(report, "ITLS_MS", (0.0, 5.0))
    table = report.rows(_runs(ALL, itls=(0.0, 5.0)))
    assert [r["itl_ms"] for r in table] == [0.0, 0.0, 5.0, 5.0]
    for row in table[2:]:
        assert row["gateway_above_floor_us"] == pytest.approx(300.0)
        assert math.isnan(row["above_floor_aim_us"]) and math.isnan(row["meets_above_floor_aim"])
    main, _ = _printed(capsys, table)
    aims = [p["gw above floor us (aim)"] for p in _cells(main[:5])]
    assert aims == ["300 (<=150 MISS)", "300 (<=150 MISS)", "300", "300"]
    assert all("ok" not in line and "MISS" not in line for line in main[3:5])


def test_the_relays_table_judges_only_ttft_p99(capsys: pytest.CaptureFixture[str]) -> None:
    _, relays = _printed(capsys, report.rows(_runs(ALL)))
    assert "(aim)" not in relays[0].replace("TTFT p99 native / python / router (aim)", "")
    for line in relays[1:5]:
        # nginx, router, floor, gw native / python, plain native / python, then the ratios
        # native/router, python/router, plain native/nginx, plain python/nginx, bare.
        assert line.split()[2:] == [
            "700", "800", "600", "900", "1000", "800", "950", "1.12", "1.25", "1.14", "1.36",
            "3.0", "/", "3.0", "/", "3.0", "ok",
        ]  # fmt: skip
    assert "for information" in relays[-1] and "0.9" not in relays[-1]


def test_ttft_p99_over_the_routers_is_a_miss(capsys: pytest.CaptureFixture[str]) -> None:
    table = report.rows(_runs(ALL, ttft={"vllm-router": [1.0, 2.0, 2.5]}))
    assert all(r["meets_ttft_p99_aim"] is False for r in table)
    _, relays = _printed(capsys, table)
    assert all(line.endswith("3.0 / 3.0 / 2.5 MISS") for line in relays[1:5])


def test_without_the_peers_there_is_no_ttft_verdict_and_the_cpu_aim_stands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    table = report.rows(_runs((*MODES, *PYTHON_MODES)))
    for row in table:
        assert math.isnan(row["gateway_router_cpu_ratio"]) and math.isnan(row["meets_ttft_p99_aim"])
        assert row["meets_above_floor_aim"] is (row["itl_ms"] == 20.0)
    main, relays = _printed(capsys, table)
    assert "300 (<=150 MISS)" in main[1] and "300 (<=600 ok)" in main[3]
    assert all(line.endswith("3.0 / 3.0 / nan") for line in relays[1:5])


def test_the_json_carries_the_new_aims_only(tmp_path: Path) -> None:
    runs = _runs(ALL)
    summary = report.rows(runs)
    report.write_json(tmp_path, {"host": "test"}, {0.0: 3, 20.0: 1}, False, summary, runs)
    out = orjson.loads((tmp_path / "overhead.json").read_bytes())
    assert out["targets"] == {
        "above_floor_us": {"itl_0ms": 150.0, "itl_20ms": 600.0},
        "ttft_p99": "<= vllm-router",
    }
    first, last = out["summary"][0], out["summary"][-1]
    assert (first["above_floor_aim_us"], first["meets_above_floor_aim"]) == (150.0, False)
    assert (last["above_floor_aim_us"], last["meets_above_floor_aim"]) == (600.0, True)
    assert first["gateway_above_floor_us"] == pytest.approx(300.0)
    assert first["meets_ttft_p99_aim"] is True
    assert not {"router_aim_room_us", "nginx_aim_room_us"} & first.keys()
