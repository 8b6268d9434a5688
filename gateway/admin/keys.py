"""The admin API's data-plane keys: make one, list them, revoke one (the routes are api.py's).

    POST   /admin/keys        {"tenant", "priority"?, "default_priority"?, "rpm"?, "tpm"?,
                               "max_inflight"?, "expires"?}        -> 201 KEY + {"key": SECRET}
    GET    /admin/keys        -> 200 {"keys": [KEY, ...]}            # never a secret
    DELETE /admin/keys/{id}   -> 200 KEY (revoked; revoking it again changes nothing)

The secret is in the answer to POST only: the store keeps its hash. A revocation is saved,
then applied here at once and, with shared state, on every replica as it converges.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from gateway.admin.errors import AdminError, bad_request
from gateway.admin.service import AdminService
from gateway.admin.store import StoreError
from gateway.auth import spec
from gateway.auth.keys import Key, digest, new_id, new_secret, shown


class KeyAdmin:
    def __init__(self, service: AdminService, clock: Callable[[], float] = time.time) -> None:
        self.service = service
        self._clock = clock

    async def list(self) -> dict[str, Any]:
        await self._current()
        now = self._clock()
        keys = sorted(self.service.keys.by_id.values(), key=lambda k: (k.created, k.id))
        return {"keys": [k.view(now) for k in keys]}

    async def create(self, body: object, who: str) -> dict[str, Any]:
        now = self._clock()
        try:
            made = spec.parse(body, self.service.config, now)
        except spec.SpecError as exc:
            raise bad_request(str(exc)) from None
        secret = new_secret()
        key = Key(
            new_id(), digest(secret), shown(secret), made.tenant, made.priority,
            made.default_priority, made.rpm, made.tpm, made.max_inflight, made.expires, now, who,
        )  # fmt: skip
        await self.service.put_key(key, "key created", who)
        return {**key.view(now), "key": secret}

    async def revoke(self, key_id: str, who: str) -> dict[str, Any]:
        if key_id not in self.service.keys.by_id:
            await self._current()  # made through another replica a moment ago?
        key = self.service.keys.by_id.get(key_id)
        if key is None:
            raise AdminError(f"unknown key {key_id!r}", status=404, code="key_not_found")
        if key.revoked is None:
            key = key.revoke(self._clock(), who)
            await self.service.put_key(key, "key revoked", who)
        return self.service.keys.by_id.get(key_id, key).view(self._clock())

    async def _current(self) -> None:
        """With shared state, this replica brought to the latest version first (a key made
        or revoked through another one a moment ago is shown); if the store cannot be read,
        the keys this replica knows."""
        if self.service.shared is None:
            return
        with contextlib.suppress(StoreError):
            await self.service.converge()
