"""The front benchmark at a small size: both real servers answer the same streamed requests over
real keep-alive connections, and each round reads their CPU from /proc."""

from __future__ import annotations

import re

import pytest

from loadtest.bench import front

pytestmark = pytest.mark.slow


def test_both_servers_answer_and_are_measured(capsys: pytest.CaptureFixture[str]) -> None:
    assert front.main(["--rounds", "1", "--concurrency", "4", "--requests", "50"]) == 0
    out = capsys.readouterr().out
    rounds = re.findall(r"round 1 (\w+) *: +([\d.]+) us CPU per request, ([\d,]+) req/s", out)
    assert sorted(kind for kind, _, _ in rounds) == ["aiohttp", "protocol"], out
    assert all(float(rate.replace(",", "")) > 0 for _, _, rate in rounds), out
    assert re.search(r"aiohttp costs -?[\d.]+ us per request more", out), out


def test_a_count_below_one_is_refused_by_name() -> None:
    with pytest.raises(SystemExit) as exc:
        front.main(["--requests", "0"])
    assert exc.value.code == 2
