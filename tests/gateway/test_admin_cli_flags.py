"""`unitgate admin` argument parsing (flags on either side of the verb) and what `drain --wait`
says is still in flight, without a gateway (tests/integration/test_cli_admin.py runs one)."""

from __future__ import annotations

import pytest

from gateway.admin.cli import DEFAULT_TOKEN_ENV, DEFAULT_URL, parser
from gateway.admin.drain_wait import DEFAULT_WAIT, still_busy


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
