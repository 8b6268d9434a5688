"""Settings of data-plane authentication: `[auth]`, API keys on the public listener.

Keys themselves are not configuration: they are made and revoked through the admin API and
live in the state backend (gateway/auth/). This section only says whether one is required.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AuthConfig:
    # false: a valid key names its tenant; no key, or one that is not (or no longer) valid,
    # is served as the "anonymous" tenant. true: such requests get 401 invalid_api_key.
    required: bool = False
