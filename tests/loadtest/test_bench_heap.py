"""The heap benchmark end to end at a small size: a real simulator, a gateway whose heap is
traced, and the load generator holding its streams open."""

from __future__ import annotations

import re

import pytest

from loadtest.bench import heap

pytestmark = pytest.mark.slow


def test_it_counts_the_heap_an_open_stream_holds(capsys: pytest.CaptureFixture[str]) -> None:
    assert heap.main(["--streams", "40", "--top", "10"]) == 0
    out = capsys.readouterr().out
    found = re.search(r"([\d.]+) KB of Python heap per open stream \(40 open\)", out)
    assert found is not None, out
    # A stream holds its request's objects, its connection to the unit and its relay state:
    # kilobytes, not bytes nor megabytes.
    assert 2 < float(found[1]) < 200, out
    rows = re.findall(r"^\| [\d,]+ \| [\d.-]+ \| (\S+):\d+ \|$", out, re.MULTILINE)
    assert len(rows) == 10 and any(r.startswith("gateway/") for r in rows), out
