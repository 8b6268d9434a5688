"""The scheduler benchmark runs, and its baseline really does the extra work it claims.

Counted, not timed: which token runs each variant hands to the tokenizer. A timed ratio here
failed on a busy 2-core machine (performance claims come from the benchmark itself).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from loadtest.bench import scheduler

REAL_DECODE = scheduler.TOKENIZER.decode


def decoded_lengths(monkeypatch: pytest.MonkeyPatch, baseline: bool) -> list[int]:
    seen: list[int] = []
    real = REAL_DECODE

    def counting(ids: Sequence[int]) -> str:
        seen.append(len(ids))
        return real(ids)

    monkeypatch.setattr(scheduler.TOKENIZER, "decode", counting)
    scheduler._run((64, 1500), steps=3, baseline=baseline)
    return seen


def test_only_the_baseline_decodes_whole_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    incremental = decoded_lengths(monkeypatch, baseline=False)
    baseline = decoded_lengths(monkeypatch, baseline=True)
    # The scheduler decodes a few tokens at a time whatever the length; the baseline decodes
    # every sequence's whole output (1,500 tokens and more) at every timed step.
    assert incremental and max(incremental) < 64
    whole = [n for n in baseline if n >= 1500]
    assert len(whole) >= scheduler.BATCH * 3


def test_main_prints_one_row_per_length(capsys: pytest.CaptureFixture[str]) -> None:
    assert scheduler.main(["--steps", "3"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "output tokens" in line]
    assert len(rows) == len(scheduler.LENGTHS)
