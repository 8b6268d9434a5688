"""The key table a process checks requests against: an immutable snapshot, swapped whole.

One writer per process: the admin service in the process that runs the admin API (from its
store, or from the shared state), the link to the control plane in a worker. Readers (the
request path) look a digest up in whatever snapshot is current; listeners hear of each swap,
which is how the control plane knows to send the workers the new table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import MappingProxyType

from gateway.auth.keys import Key


class KeyRing:
    def __init__(self) -> None:
        self.by_hash: MappingProxyType[str, Key] = MappingProxyType({})
        self.by_id: MappingProxyType[str, Key] = MappingProxyType({})
        self.version = 0  # of the table: each swap makes a new one
        self._listeners: list[Callable[[KeyRing], None]] = []

    def replace(self, keys: Iterable[Key]) -> None:
        found = list(keys)
        self.by_hash = MappingProxyType({k.hash: k for k in found})
        self.by_id = MappingProxyType({k.id: k for k in found})
        self.version += 1
        for listener in self._listeners:
            listener(self)

    def put(self, key: Key) -> None:
        """One key made or changed (a revocation): a new table with it."""
        self.replace([*(k for k in self.by_id.values() if k.id != key.id), key])

    def on_change(self, listener: Callable[[KeyRing], None]) -> None:
        self._listeners.append(listener)
