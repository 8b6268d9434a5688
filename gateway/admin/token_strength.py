"""Whether an admin token resists guessing: a pure check, and how to make a token that does.

The admin API can take every unit out of service, and its tokens are sent over the network, so
a short, repetitive or placeholder token is refused before any listener opens (auth.py: on a
loopback-only operator listener it is a warning instead). 24 characters of a random URL-safe
token are 144 bits; `secrets.token_urlsafe(32)` gives 43.
"""

from __future__ import annotations

MIN_LENGTH = 24
MIN_DISTINCT = 8  # an all-same or two-letter token is long without being random
# Words that mark a value copied from an example rather than generated.
PLACEHOLDERS = ("replace", "changeme", "change-me", "change_me", "example", "password")

HOW_TO = (
    'make one with: python -c "import secrets; print(secrets.token_urlsafe(32))"'
    " (or: openssl rand -hex 32)"
)


def weakness(token: str) -> str | None:
    """Why `token` is too weak for the admin API, or None. Never quotes the token."""
    if len(token) < MIN_LENGTH:
        return f"is {len(token)} characters long, at least {MIN_LENGTH} are needed"
    distinct = len(set(token))
    if distinct < MIN_DISTINCT:
        return f"uses only {distinct} different characters, at least {MIN_DISTINCT} are needed"
    lowered = token.lower()
    for word in PLACEHOLDERS:
        if word in lowered:
            return f"contains {word!r}: it looks copied from an example, not generated"
    return None
