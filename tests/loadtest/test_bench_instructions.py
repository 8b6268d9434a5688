"""The instruction-count A/B at a small size: the floor relay and this tree's gateway, each
under callgrind over the same simulated units, counted over the same closed loop."""

from __future__ import annotations

import re
import shutil

import pytest

from loadtest.bench import instructions

pytestmark = [
    pytest.mark.serial,  # two processes under valgrind: it loads both cores
    pytest.mark.skipif(
        shutil.which("valgrind") is None, reason="needs valgrind (make test installs it)"
    ),
]

DUMP = """version: 1
creator: callgrind-3.19.0
events: Ir
summary: 18446744073679610025
totals: 256242692
"""


def test_a_dumps_totals_line_is_its_count() -> None:
    # (its summary line can wrap below zero when counting was zeroed mid-run: not read)
    assert instructions.totals(DUMP) == 256242692
    assert instructions.totals("events: Ir\n") == 0


def test_the_floor_and_this_tree_are_counted(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--base", "floor", "--requests", "20", "--concurrency", "4", "--top", "3"]
    assert instructions.main(argv) == 0
    out = capsys.readouterr().out
    counts = dict(re.findall(r"\| (floor|this tree) \| ([\d,]+) \|", out))
    floor, this = (int(counts[side].replace(",", "")) for side in ("floor", "this tree"))
    # A request relayed verbatim costs some tens of thousands of instructions; the gateway
    # (parsing, routing, tracking every token for resumption) several times as many.
    assert 10_000 < floor < this, out
    assert re.search(r"this tree - floor: \+[\d,]+ instructions a request", out), out
    costliest = out.split("costliest functions")[1].strip().splitlines()[1:]
    assert len(costliest) == 3 and all(re.match(r"\s*[\d,]+ \S+:\S+ \(", r) for r in costliest)


def test_bad_arguments_are_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        instructions.main(["--requests", "0"])
    assert "--requests must be at least 1, not 0" in capsys.readouterr().err
