"""Where the operator's state lives: in this process's SQLite file, or shared through Redis.

With `backend = "redis"` every replica of the gateway reads and writes the same admin
overrides (disable, drain, enable, units added or removed at run time), so an operator acting
through one replica acts on the fleet. The credentials never sit in the TOML: the URL may not
carry a password, which comes from an env var or a file.

Each replica also reports, every `heartbeat` seconds, the state version it routes by and its
in-flight count per unit, under a key that expires after `replica_ttl`: that is what makes
`drain` mean "no replica has a request on this unit", and the shared events log (a Redis
stream of at most `events_kept` entries) holds every replica's events.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gateway.config.checks import check, positive

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
    replica: str = ""  # this gateway's name in the fleet; "" = "<hostname>:<pid>"
    heartbeat: float = 0.25  # seconds between this replica's reports of its in-flight counts
    replica_ttl: float = 3.0  # a replica silent this long is gone (crashed or cut off)
    events_kept: int = 10_000  # the shared events log's bound (approximate, as Redis trims)

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
            not any(c.isspace() for c in self.replica),
            "replica",
            self.replica,
            "must be a name without spaces",
        )
        positive("heartbeat", self.heartbeat)
        check(
            self.replica_ttl >= 4 * self.heartbeat,
            "replica_ttl",
            self.replica_ttl,
            f"must be at least 4 heartbeats ({4 * self.heartbeat:g} s), or a busy replica's "
            "report expires between two of its writes",
        )
        check(self.events_kept >= 100, "events_kept", self.events_kept, "must be >= 100")
        check(
            not self.tls_ca_file or parts.scheme == "rediss",
            "tls_ca_file",
            self.tls_ca_file,
            "only applies to a rediss:// url",
        )

    def replica_name(self) -> str:
        return self.replica or f"{socket.gethostname()}:{os.getpid()}"

    def client_options(self) -> dict[str, Any]:
        """redis-py's options for this store: timeouts, credentials, the CA for rediss://."""
        options: dict[str, Any] = {
            "socket_timeout": self.timeout,
            "socket_connect_timeout": self.timeout,
            "username": self.username or None,
            "password": self.password(),
        }
        if self.tls_ca_file:
            options["ssl_ca_certs"] = self.tls_ca_file
        return options

    def password(self) -> str | None:
        """From the env var, else the file's first line, else None (no AUTH)."""
        if self.password_env and (value := os.environ.get(self.password_env)):
            return value
        if self.password_file:
            lines = Path(self.password_file).read_text().splitlines()
            return lines[0] if lines else None
        return None
