"""Where the operator's state lives: in this process's SQLite file, or shared through Redis.

With `backend = "redis"` every replica of the gateway reads and writes the same admin
overrides (disable, drain, enable, units added or removed at run time), so an operator acting
through one replica acts on the fleet. The credentials never sit in the TOML: the URL may not
carry a password, which comes from an env var or a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gateway.config.checks import check

BACKENDS = ("sqlite", "redis")
SCHEMES = ("redis", "rediss", "unix")


@dataclass(frozen=True, slots=True)
class StateConfig:
    backend: str = "sqlite"  # sqlite: [admin].state_file, this process only; redis: shared
    url: str = "redis://127.0.0.1:6379/0"  # rediss:// for TLS; no password here (see below)
    key_prefix: str = "unitgate"  # every key is "<key_prefix>:..."; one prefix per fleet
    username: str = ""  # an ACL user (Redis 6+); "" = the default user
    password_env: str = "UNITGATE_REDIS_PASSWORD"  # env var holding the password, if set
    password_file: str = ""  # or a file holding it (first line); the env var wins
    tls_ca_file: str = ""  # rediss://: the CA bundle to verify the server with ("" = system)
    timeout: float = 1.0  # seconds for one command, and for a connection to be made

    def __post_init__(self) -> None:
        check(self.backend in BACKENDS, "backend", self.backend, f"must be one of {BACKENDS}")
        parts = urlsplit(self.url)
        check(parts.scheme in SCHEMES, "url", self.url, f"must be a {'/'.join(SCHEMES)}:// URL")
        check(
            parts.password is None,
            "url",
            self.url,
            "must not hold a password (use password_env or password_file)",
        )
        check(
            bool(self.key_prefix) and ":" not in self.key_prefix and " " not in self.key_prefix,
            "key_prefix",
            self.key_prefix,
            "must be a non-empty name without ':' or spaces",
        )
        check(self.timeout > 0, "timeout", self.timeout, "must be > 0 seconds")
        check(
            not self.tls_ca_file or parts.scheme == "rediss",
            "tls_ca_file",
            self.tls_ca_file,
            "only applies to a rediss:// url",
        )

    def password(self) -> str | None:
        """From the env var, else the file's first line, else None (no AUTH)."""
        if self.password_env and (value := os.environ.get(self.password_env)):
            return value
        if self.password_file:
            lines = Path(self.password_file).read_text().splitlines()
            return lines[0] if lines else None
        return None
