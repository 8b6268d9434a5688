"""`unitgate admin` argument parsing (flags on either side of the verb) and what `drain --wait`
says is still in flight, without a gateway (tests/integration/test_cli_admin.py runs one)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from gateway.admin.cli import DEFAULT_TOKEN_ENV, DEFAULT_URL, parser
from gateway.admin.client import ANSWERED_WITH_ERROR, UNREACHABLE, ClientError
from gateway.admin.drain_wait import DEFAULT_WAIT, LOOK_AT_LEAST, still_busy, wait_drained


def parse(*argv: str) -> dict[str, object]:
    return vars(parser().parse_args(argv))


def test_flags_before_or_after_the_verb_are_the_same() -> None:
    flags = ("--json", "--url", "http://h:1", "--token-env", "T", "--timeout", "3")
    assert parse(*flags, "units") == parse("units", *flags)
    assert parse("units", *flags)["json"] is True


def test_a_flag_given_before_the_verb_is_not_reset_after_it() -> None:
    found = parse("--url", "http://h:1", "--json", "unit", "u0", "--token-env", "T")
    assert (found["url"], found["json"], found["token_env"]) == ("http://h:1", True, "T")
    assert parse("units") == {
        "url": DEFAULT_URL,
        "json": False,
        "token_env": DEFAULT_TOKEN_ENV,
        "timeout": 10.0,
        "command": "units",
    }


def test_drain_timeout_is_the_wait_and_the_request_timeout_goes_before() -> None:
    found = parse("--timeout", "4", "drain", "u0", "--wait", "--timeout", "60")
    assert (found["timeout"], found["wait"], found["wait_timeout"]) == (4.0, True, 60.0)
    assert parse("drain", "u0", "--wait")["wait_timeout"] is None  # DEFAULT_WAIT then
    assert DEFAULT_WAIT > 600  # the default [timeouts].total: the longest a request runs


def test_drain_timeout_without_wait_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.admin.cli import main

    with pytest.raises(SystemExit) as done:
        main(["drain", "u0", "--timeout", "5"])
    assert done.value.code == 2
    assert "the request timeout goes before the verb" in capsys.readouterr().err


def test_still_busy_names_the_replicas_with_requests() -> None:
    alone = {"in_flight": 2}
    assert still_busy(alone) == "2 in flight"
    fleet = {
        "in_flight": 0,
        "fleet": {
            "in_flight": 3,
            "current": False,
            "replicas": {
                "a": {"in_flight": 0, "version": 4, "age_s": 0.1},
                "b": {"in_flight": 3, "version": 3, "age_s": 0.2},
            },
        },
    }
    assert still_busy(fleet) == (
        "3 in flight across the fleet (b: 3); not every replica has applied the drain yet"
    )
    unread = {"in_flight": 0, "fleet": {"error": "the fleet's in-flight counts are unknown: x"}}
    assert still_busy(unread) == "0 in flight here; the fleet's in-flight counts are unknown: x"


class _BusyUnit:
    """An AdminClient stand-in: a unit that stays draining with one request in flight, on a
    fake clock each look advances by `answer_in`; it records every look's timeout."""

    def __init__(self, clock: list[float], answer_in: float) -> None:
        self.timeout, self.clock, self.answer_in = 10.0, clock, answer_in
        self.looks: list[float] = []

    def get(self, path: str, timeout: float | None = None) -> dict[str, Any]:
        assert timeout is not None
        self.looks.append(timeout)
        if self.answer_in > timeout:  # what urllib does when the answer comes too late
            raise ClientError("cannot reach x: timed out", UNREACHABLE)
        self.clock[0] += self.answer_in
        return {"drained": False, "admin": {"state": "draining"}, "in_flight": 1}


def test_the_last_look_at_the_deadline_has_time_to_be_answered() -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    client = _BusyUnit(now, answer_in=0.05)  # a loaded machine: 50 ms per answer
    with pytest.raises(ClientError) as raised:
        wait_drained(client, "u0", 1.0, io.StringIO(), lambda: now[0], sleep)  # type: ignore[arg-type]
    # What keeps the unit busy, not "unreachable": the look at the deadline was answered.
    assert (raised.value.exit_code, str(raised.value)) == (
        ANSWERED_WITH_ERROR,
        "u0 not drained after 1 s: 1 in flight",
    )
    assert min(client.looks) == LOOK_AT_LEAST and max(client.looks) <= client.timeout
