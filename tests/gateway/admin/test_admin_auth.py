"""Admin tokens: parsing, who each one is, and when the admin API may run without one."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.admin.auth import Authenticator, authenticator, is_loopback, parse_tokens
from gateway.admin.errors import AdminError, AdminStartError, Unauthenticated
from gateway.config import AdminConfig

ENV = "UNITGATE_ADMIN_TOKEN"


def test_a_bare_token_is_named_admin() -> None:
    assert parse_tokens("  s3cret\n", "env") == {"admin": "s3cret"}


def test_named_tokens() -> None:
    assert parse_tokens("alice:a1, bob : b2", "env") == {"alice": "a1", "bob": "b2"}


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "is empty"),
        ("alice:a1,bob", "entry 2 is not of the form name:token"),
        ("alice:", "entry 1 is not of the form name:token"),
        (":tok", "entry 1"),
        ("a:1,a:2", "the name 'a' appears twice"),
        ("a:same,b:same", "two names share one token"),
    ],
)
def test_malformed_token_lists(value: str, problem: str) -> None:
    with pytest.raises(AdminStartError, match=problem) as caught:
        parse_tokens(value, "environment variable X")
    assert "environment variable X" in str(caught.value)


@pytest.mark.parametrize("value", ["alice:topsecret,bob", "a:topsecret,b:topsecret"])
def test_errors_never_echo_a_token(value: str) -> None:
    with pytest.raises(AdminStartError) as caught:
        parse_tokens(value, "env")
    assert "topsecret" not in str(caught.value)


def test_who_is_the_name_of_the_matching_token() -> None:
    auth = Authenticator({"alice": "a1", "bob": "b2"})
    assert auth.who("Bearer b2") == "bob"
    assert auth.who("bearer  a1 ") == "alice"


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer   ", "Basic a1", "a1"])
def test_missing_or_malformed_header_is_401(header: str | None) -> None:
    with pytest.raises(Unauthenticated) as caught:
        Authenticator({"admin": "a1"}).who(header)
    assert caught.value.status == 401
    assert caught.value.headers()["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("token", ["a2", "a1a", "a", "A1"])
def test_wrong_token_is_403(token: str) -> None:
    with pytest.raises(AdminError) as caught:
        Authenticator({"admin": "a1"}).who(f"Bearer {token}")
    assert caught.value.status == 403


def test_env_var_wins_over_the_file(tmp_path: Path) -> None:
    file = tmp_path / "token"
    file.write_text("from-file\nignored second line\n")
    config = AdminConfig(token_file=str(file))
    assert authenticator(config, "127.0.0.1", {ENV: "from-env"}).who("Bearer from-env") == "admin"
    assert authenticator(config, "127.0.0.1", {}).who("Bearer from-file") == "admin"
    assert authenticator(config, "127.0.0.1", {ENV: "  "}).who("Bearer from-file") == "admin"


def test_unreadable_token_file_names_it(tmp_path: Path) -> None:
    config = AdminConfig(token_file=str(tmp_path / "missing"))
    with pytest.raises(AdminStartError, match=r"\[admin\]\.token_file: cannot read .*missing"):
        authenticator(config, "127.0.0.1", {})


def test_no_token_refuses_to_start() -> None:
    with pytest.raises(AdminStartError, match=r"\[admin\]\.token_env: no admin token.*" + ENV):
        authenticator(AdminConfig(), "127.0.0.1", {})


def test_unauthenticated_only_on_loopback() -> None:
    config = AdminConfig(allow_unauthenticated_loopback=True)
    auth = authenticator(config, "127.0.0.1", {})
    assert auth.open and auth.who(None) == "local"
    with pytest.raises(AdminStartError, match="needs a loopback"):
        authenticator(config, "0.0.0.0", {})
    # A token, when there is one, is required even on loopback.
    assert not authenticator(config, "127.0.0.1", {ENV: "t"}).open


LOOPBACK = ["127.0.0.1", "127.3.2.1", "::1", "localhost"]
NOT_LOOPBACK = ["0.0.0.0", "::", "10.0.0.1", "", "gw.local"]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [(h, True) for h in LOOPBACK] + [(h, False) for h in NOT_LOOPBACK],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
