"""Admin tokens too weak to resist guessing: refused at start when the operator listener is
reachable from other hosts, a warning on loopback; the message says how to make a good one."""

from __future__ import annotations

import logging
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.admin.auth import authenticator
from gateway.admin.errors import AdminStartError
from gateway.admin.token_strength import MIN_LENGTH, weakness
from gateway.config import AdminConfig, Config, config_from_dict
from gateway.server import running
from tests.support import ROOT

ENV = "UNITGATE_ADMIN_TOKEN"
GOOD = secrets.token_urlsafe(32)
HOW = "secrets.token_urlsafe(32)"


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("s3cre", "is 5 characters long, at least 24"),
        ("x" * (MIN_LENGTH - 1), f"is {MIN_LENGTH - 1} characters long"),
        ("a" * 64, "uses only 1 different characters"),
        ("abab" * 10, "uses only 2 different characters"),
        ("REPLACE-WITH-A-LONG-RANDOM-TOKEN", "contains 'replace'"),
        ("my-Password-1234567890-abcdef", "contains 'password'"),
    ],
)
def test_weak_tokens_and_why(token: str, problem: str) -> None:
    reason = weakness(token)
    assert reason is not None and problem in reason
    assert token not in reason  # never quoted


@pytest.mark.parametrize(
    "make",
    [
        lambda: GOOD,
        lambda: secrets.token_hex(16),
        lambda: secrets.token_urlsafe(18),
        lambda: "ops-" + secrets.token_hex(12),
    ],
    ids=["good", "token_hex", "token_urlsafe", "prefixed"],
)
def test_generated_tokens_pass(make: Callable[[], str]) -> None:
    token = make()  # made here, not at collection: the test ids stay the same in every run
    assert weakness(token) is None


def test_a_short_token_is_refused_off_loopback() -> None:
    with pytest.raises(AdminStartError) as caught:
        authenticator(AdminConfig(), "0.0.0.0", {ENV: "hunter2"})
    message = str(caught.value)
    assert message.startswith(f"[admin].token_env ({ENV}): the admin token is 7 characters")
    assert HOW in message and "0.0.0.0" in message
    assert "hunter2" not in message


def test_named_tokens_are_each_checked_and_named(tmp_path: Path) -> None:
    file = tmp_path / "tokens"
    file.write_text(f"alice:{GOOD},bob:short-one\n")
    with pytest.raises(AdminStartError, match=r"\[admin\]\.token_file .*'bob' is 9 characters"):
        authenticator(AdminConfig(token_file=str(file)), "10.0.0.1", {})
    assert authenticator(AdminConfig(), "10.0.0.1", {ENV: f"alice:{GOOD}"}).who(f"Bearer {GOOD}")


def test_loopback_only_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="unitgate.admin"):
        auth = authenticator(AdminConfig(), "127.0.0.1", {ENV: "dev"})
    assert auth.who("Bearer dev") == "admin"
    assert "is 3 characters long" in caplog.text and HOW in caplog.text
    assert "loopback" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="unitgate.admin"):
        authenticator(AdminConfig(), "0.0.0.0", {ENV: GOOD})
    assert caplog.text == ""  # a good token: not a word


def config(host: str) -> Config:
    return config_from_dict(
        {
            "gateway": {"port": 0},
            "metrics": {"host": host, "port": 0},
            "admin": {"state_file": ""},
            "health": {"enabled": False},
        }
    )


async def test_a_gateway_on_every_address_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV, "s3cre")
    with pytest.raises(AdminStartError, match="is 5 characters long"):
        async with running(config("0.0.0.0")):
            pass
    monkeypatch.setenv(ENV, GOOD)
    async with running(config("0.0.0.0")) as gw:
        assert gw.metrics_url


def test_the_cli_says_how_to_make_a_good_token(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('[gateway]\nport = 0\n[metrics]\nhost = "0.0.0.0"\nport = 0\n')
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "gateway", "--config", str(path)],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), ENV: "s3cre"},
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode != 0
    err = proc.stderr.decode()
    assert "is 5 characters long" in err and HOW in err and "s3cre" not in err
