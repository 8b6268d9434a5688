"""Who is calling the admin API: bearer tokens, each with a name that the events log records.

The admin API can take every unit out of service, so it fails closed: without a token the
gateway refuses to start, unless the operator explicitly opted into unauthenticated access AND
the operator listener is reachable from this host only (local development).

Tokens are compared as SHA-256 digests with `hmac.compare_digest`, against every configured
token without stopping at the first match, so timing tells an attacker neither a token's
prefix nor its length nor which entry matched.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from gateway.admin.errors import AdminStartError, Unauthenticated, forbidden
from gateway.admin.token_strength import HOW_TO, weakness
from gateway.base.net import is_loopback
from gateway.config import AdminConfig

log = logging.getLogger("unitgate.admin")

LOCAL = "local"  # `who` of requests in unauthenticated loopback mode
DEFAULT_NAME = "admin"  # `who` of a bare token


class Authenticator:
    """Maps an `Authorization` header to the caller's name; `tokens=None` accepts everyone."""

    def __init__(self, tokens: Mapping[str, str] | None) -> None:
        self._digests = (
            None if tokens is None else [(name, _digest(tok)) for name, tok in tokens.items()]
        )

    @property
    def open(self) -> bool:
        return self._digests is None

    def who(self, header: str | None) -> str:
        if self._digests is None:
            return LOCAL
        scheme, _, token = (header or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("admin API: send `Authorization: Bearer <token>`")
        given = _digest(token)
        matched = [name for name, digest in self._digests if hmac.compare_digest(given, digest)]
        if not matched:
            raise forbidden("admin API: the token is not valid")
        return matched[0]


def authenticator(
    admin: AdminConfig, ops_host: str, environ: Mapping[str, str] = os.environ
) -> Authenticator:
    """The admin API's authenticator, or AdminStartError when it may not run as configured."""
    tokens = read_tokens(admin, environ)
    if tokens is not None:
        check_strength(tokens, _source(admin, environ), ops_host)
        return Authenticator(tokens)
    if admin.allow_unauthenticated_loopback and is_loopback(ops_host):
        log.warning(
            "admin API on %s accepts requests WITHOUT authentication "
            "([admin].allow_unauthenticated_loopback = true); production must set %s",
            ops_host,
            admin.token_env,
        )
        return Authenticator(None)
    hint = (
        f"; allow_unauthenticated_loopback needs a loopback [metrics].host, not {ops_host!r}"
        if admin.allow_unauthenticated_loopback
        else ""
    )
    raise AdminStartError(
        f"[admin].token_env: no admin token: set the environment variable {admin.token_env} "
        f"(or [admin].token_file), or disable the admin API with [admin].enabled = false{hint}"
    )


def check_strength(tokens: Mapping[str, str], source: str, ops_host: str) -> None:
    """Refuse a token too weak to resist guessing (token_strength.py), unless the operator
    listener is reachable from this host only: then warn, for local development."""
    for name, token in tokens.items():
        problem = weakness(token)
        if problem is None:
            continue
        which = f"the admin token {name!r}" if len(tokens) > 1 else "the admin token"
        message = f"{source}: {which} {problem}; {HOW_TO}"
        if not is_loopback(ops_host):
            raise AdminStartError(
                f"{message} (refused: [metrics].host {ops_host!r} is reachable from other hosts)"
            )
        log.warning("%s (accepted only because [metrics].host %s is loopback)", message, ops_host)


def _source(admin: AdminConfig, environ: Mapping[str, str]) -> str:
    if environ.get(admin.token_env, "").strip():
        return f"[admin].token_env ({admin.token_env})"
    return f"[admin].token_file ({admin.token_file})"


def read_tokens(admin: AdminConfig, environ: Mapping[str, str]) -> dict[str, str] | None:
    """Tokens by name from the env var named by `token_env`, else `token_file`; None if neither."""
    value = environ.get(admin.token_env, "")
    if value.strip():
        return parse_tokens(value, f"environment variable {admin.token_env} ([admin].token_env)")
    if not admin.token_file:
        return None
    path = Path(admin.token_file)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise AdminStartError(f"[admin].token_file: cannot read {path}: {exc}") from None
    return parse_tokens(lines[0] if lines else "", f"[admin].token_file {path}")


def parse_tokens(value: str, source: str) -> dict[str, str]:
    """`token` (named "admin") or `name:token,name:token`. Errors never echo a secret."""
    value = value.strip()
    if not value:
        raise AdminStartError(f"{source}: is empty")
    if ":" not in value and "," not in value:
        return {DEFAULT_NAME: value}
    tokens: dict[str, str] = {}
    for number, entry in enumerate(value.split(","), start=1):
        name, sep, token = entry.partition(":")
        name, token = name.strip(), token.strip()
        if not sep or not name or not token:
            raise AdminStartError(f"{source}: entry {number} is not of the form name:token")
        if name in tokens:
            raise AdminStartError(f"{source}: the name {name!r} appears twice")
        tokens[name] = token
    if len(set(tokens.values())) != len(tokens):
        raise AdminStartError(f"{source}: two names share one token; `who` would be ambiguous")
    return tokens


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()
