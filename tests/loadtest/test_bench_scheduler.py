"""The scheduler benchmark runs, and its baseline really does the extra work it claims."""

from __future__ import annotations

import pytest

from loadtest import bench_scheduler


def test_the_step_cost_stays_flat_and_the_baseline_grows_with_length() -> None:
    now = bench_scheduler._run((64, 1500), steps=30, baseline=False)
    before = bench_scheduler._run((64, 1500), steps=30, baseline=True)
    assert set(now) == set(before) == {64, 1500}
    # Re-decoding 1,500 tokens x 8 sequences costs far more than one token each; a ratio this
    # loose holds on a loaded machine and still fails if the baseline skipped its work.
    assert before[1500] > 3 * now[1500]


def test_main_prints_one_row_per_length(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_scheduler.main(["--steps", "3"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "output tokens" in line]
    assert len(rows) == len(bench_scheduler.LENGTHS)
