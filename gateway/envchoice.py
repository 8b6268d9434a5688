"""A setting that an environment variable may override for one run (the relay, the front):
the test suite runs once each way, and an A/B needs no config edit."""

from __future__ import annotations

import os


def env_choice(env: str, configured: str, key: str, choices: tuple[str, ...]) -> str:
    """$`env` when set, else `configured` (the config's `key`); one of `choices`."""
    overridden = os.environ.get(env, "").strip()
    chosen = overridden or configured
    if chosen not in choices:
        source = env if overridden else key
        raise ValueError(f"{source} = {chosen!r}: must be one of {', '.join(choices)}")
    return chosen
