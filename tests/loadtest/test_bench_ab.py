"""The A/B benchmark at a small size: the gateway of a git revision and this tree's, over the
same simulated units, each measured from /proc in alternating rounds; the base's worktree goes
away afterwards."""

from __future__ import annotations

import re
import subprocess

import pytest

from loadtest.bench import ab

pytestmark = pytest.mark.slow


def _worktrees() -> str:
    return subprocess.run(
        ["git", "-C", str(ab.ROOT), "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout


def test_both_gateways_stream_and_are_measured(capsys: pytest.CaptureFixture[str]) -> None:
    before = _worktrees()
    argv = ["--base", "HEAD", "--rounds", "1", "--concurrency", "4", "--requests", "40"]
    assert ab.main([*argv, "--idle", "0.5"]) == 0
    out = capsys.readouterr().out
    rounds = re.findall(r"round 1 (base|this): +(\d+) us CPU per request", out)
    assert sorted(side for side, _ in rounds) == ["base", "this"], out
    assert all(int(us) > 0 for _, us in rounds), out
    assert len(re.findall(r"idle (base|this): user [\d.]+ \+ system [\d.]+ ms", out)) == 2, out
    assert re.search(r"this tree / base: \d+\.\d{3} \(round by round: \d+\.\d{3}\)", out), out
    assert re.search(r"this tree - base: [+-][\d,]+ us a request \(round by round: [+-]\d+\)", out)
    assert _worktrees() == before  # the base's checkout was removed


def test_the_floor_relay_can_be_the_base(capsys: pytest.CaptureFixture[str]) -> None:
    """The relay aims are set against the floor relay: it takes the base's place, from this
    tree, with no worktree made."""
    before = _worktrees()
    argv = ["--base", "floor", "--rounds", "1", "--concurrency", "4", "--requests", "40"]
    assert ab.main(argv) == 0
    out = capsys.readouterr().out
    rounds = dict(re.findall(r"round 1 (base|this): +(\d+) us CPU per request", out))
    assert set(rounds) == {"base", "this"} and all(int(us) > 0 for us in rounds.values()), out
    assert "| floor |" in out and re.search(r"this tree - floor: [+-][\d,]+ us a request", out)
    assert _worktrees() == before


def test_an_unknown_revision_is_refused_by_name() -> None:
    with pytest.raises(SystemExit, match="no worktree of 'no-such-rev'"):
        ab.main(["--base", "no-such-rev", "--requests", "1"])


def test_a_count_below_one_is_refused_by_name() -> None:
    with pytest.raises(SystemExit) as exc:
        ab.main(["--rounds", "0"])
    assert exc.value.code == 2
