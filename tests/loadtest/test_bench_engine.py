"""The engine benchmark's paired split of a TP=2 step into model time and runtime time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.bench.engine import analyze

US = 1_000  # stamps are nanoseconds


def _step(t0: int, send: int, f0: int, f1: int, t1: int, batch: int = 8) -> list[int]:
    """A leader step record: entries, tokens, step start/end, forward start/end, send()."""
    return [batch, batch, t0 * US, t1 * US, f0 * US, f1 * US, send * US, (send + 50) * US]


def _call(r1: int, g0: int, g1: int, batch: int = 8) -> list[int]:
    """A follower forward record: entries, tokens, forward start/end, receive() start/end."""
    return [batch, batch, g0 * US, g1 * US, (r1 - 400) * US, r1 * US]


def test_split_uses_the_later_forward_start_and_counts_the_gap() -> None:
    # step 0: the follower enters forward after the leader (at 420 vs 100): the model starts
    # at 420. step 1: the follower is first (at 10_150 vs 10_200): the model starts at 10_200.
    steps = [_step(0, 40, 100, 9_000, 9_200), _step(9_220, 9_260, 10_200, 19_000, 19_300)]
    calls = [_call(400, 420, 9_010), _call(10_140, 10_150, 19_010)]
    rounds = [{"first_step": 0, "steps": steps}]
    parts = analyze._paired_steps(rounds, calls, 8)
    assert [v // US for v in parts["model"]] == [9_000 - 420, 19_000 - 10_200]
    assert [v // US for v in parts["runtime"]] == [9_200 - 8_580, 10_080 - 8_800]
    assert [v // US for v in parts["wire"]] == [400 - 40, 10_140 - 9_260]
    assert [v // US for v in parts["publish"]] == [100 - 90, 10_200 - 9_310]
    assert [v // US for v in parts["follower_lag"]] == [320, -50]
    assert [v // US for v in parts["gap"]] == [20]
    assert [v // US for v in parts["cadence"]] == [620 + 20]


def test_partial_batches_are_skipped_and_the_pairing_is_checked() -> None:
    prefill = [1, 16, 0, 5_000 * US, 100 * US, 4_000 * US, 40 * US, 90 * US]
    steps = [prefill, _step(5_020, 5_060, 5_100, 9_000, 9_200, batch=1)]
    calls = [[1, 16, 200 * US, 4_000 * US, 0, 150 * US], _call(5_300, 5_320, 9_010, batch=1)]
    parts = analyze._paired_steps([{"first_step": 0, "steps": steps}], calls, 1)
    assert len(parts["runtime"]) == 1 and parts["gap"] == []
    calls[1] = _call(5_300, 5_320, 9_010, batch=2)
    with pytest.raises(ValueError, match="leader and follower differ"):
        analyze._paired_steps([{"first_step": 0, "steps": steps}], calls, 1)


def test_the_aim_compares_with_the_bare_loop_and_the_ping_pong_is_shown() -> None:
    steps = [_step(0, 40, 100, 9_000, 9_200)]
    calls = [_call(400, 420, 9_010)]
    leader = {"8": [{"first_step": 0, "steps": steps}]}
    bare = {"8": {"one_way_us": {"p50": 310.0}}}
    pingpong = {"8": {"one_way_us": {"p50": 200.0}}}
    row = analyze.runtime(leader, calls, pingpong, bare)["8"]
    assert row["runtime"]["p50"] == pytest.approx(620.0)
    assert row["ratio"] == pytest.approx(2.0)
    assert row["ratio_pingpong"] == pytest.approx(3.1)
    assert row["meets_aim"] is True


@pytest.mark.slow
def test_the_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    """Real processes and a real Gloo pair, at the smallest sizes: the report prints every
    section and the greedy outputs agree across TP=1 and TP=2."""
    argv = ["--out", str(tmp_path), "--iters", "20", "--rounds", "1", "--max-tokens", "6"]
    proc = subprocess.run(
        [sys.executable, "-m", "loadtest.bench.engine", *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for heading in ("1. step message", "bare step loop", "2. per-step", "3. decode throughput"):
        assert heading in proc.stdout
    assert "greedy outputs identical across configs: True" in proc.stdout
    summary = json.loads((tmp_path / "engine.json").read_text())
    for batch in ("1", "8"):
        row = summary["runtime"][batch]
        assert row["runtime"]["n"] > 0 and row["model"]["p50"] > 0
