"""Which units hold which blocks, by the gateway's own block keys (keys.py), from their KV events.

Pure and synchronous: whatever reads a unit's events feeds them here in order; routing is
to ask it, for a request's block keys, how many leading blocks each unit holds.

- A stored block is keyed from its parent's key and its token ids. The parent is the engine's
  hash of the block before; the index maps each unit's engine hashes to keys, so a chain
  continues across events. A stored block whose parent the index does not know (an event
  missed, or evicted from the index) cannot be keyed and is skipped, counted in `orphans`.
- A removed block leaves its unit; `drop(unit)` forgets all of a unit's blocks (its cache was
  cleared, its engine restarted, or it left the fleet).
- Memory is bounded: at most `capacity` keys, the least recently stored or matched forgotten
  first (with every unit's entry for them).
- Only the first KV cache group is indexed (a hybrid model's others hold sliding windows, which
  a long prefix does not stay in).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from gateway.kvevents.keys import ROOT, chain_packed, packed
from gateway.kvevents.wire import Batch, Cleared, EngineHash, Removed, Stored


class KvIndex:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity!r}")
        self.capacity = capacity
        # key -> the units holding it, each with its engine's hash of it; least recent first
        self._holders: OrderedDict[int, dict[str, EngineHash]] = OrderedDict()
        self._keys: dict[str, dict[EngineHash, int]] = {}  # unit -> engine hash -> key
        self._block_size: dict[str, int] = {}
        self.orphans = 0  # stored blocks skipped: their parent was not known

    def __len__(self) -> int:
        return len(self._holders)

    def block_size(self, unit: str) -> int | None:
        """The unit's block size, as its events said (None: none stored yet)."""
        return self._block_size.get(unit)

    def blocks(self, unit: str) -> int:
        return len(self._keys.get(unit, ()))

    def apply(self, unit: str, batch: Batch) -> None:
        """A batch of `unit`'s events, in order."""
        for event in batch.events:
            if isinstance(event, Stored):
                self.stored(unit, event)
            elif isinstance(event, Removed):
                self.removed(unit, event)
            elif isinstance(event, Cleared):
                self.drop(unit)

    def stored(self, unit: str, event: Stored) -> int:
        """Index the blocks `event` says `unit` stored; how many were."""
        if event.group != 0:
            return 0
        keys = self._keys.setdefault(unit, {})
        if event.parent is None:
            parent = ROOT
        elif (known := keys.get(event.parent)) is not None:
            parent = known
        else:
            self.orphans += len(event.block_hashes)
            return 0
        size = self._block_size[unit] = event.block_size
        tokens = packed(event.token_ids)
        for i, engine_hash in enumerate(event.block_hashes):
            parent = chain_packed(parent, tokens[i * size : (i + 1) * size], event.extra)
            old = keys.get(engine_hash)
            if old is not None and old != parent:
                self._leave(unit, old)
            keys[engine_hash] = parent
            holders = self._holders.get(parent)
            if holders is None:
                holders = self._holders[parent] = {}
            else:
                self._holders.move_to_end(parent)
            holders[unit] = engine_hash
        self._bound()
        return len(event.block_hashes)

    def removed(self, unit: str, event: Removed) -> None:
        if event.group != 0:
            return
        keys = self._keys.get(unit)
        if keys is None:
            return
        for engine_hash in event.block_hashes:
            key = keys.pop(engine_hash, None)
            if key is not None:
                self._leave(unit, key, forget_hash=False)

    def drop(self, unit: str) -> None:
        """Forget every block of `unit`."""
        for key in self._keys.pop(unit, {}).values():
            self._leave(unit, key, forget_hash=False)
        self._block_size.pop(unit, None)

    def match(self, keys: Sequence[int]) -> dict[str, int]:
        """For `keys` (a prompt's block keys, in order), how many leading blocks each unit
        holds; units holding none are left out."""
        depth: dict[str, int] = {}
        alive: set[str] | None = None
        for n, key in enumerate(keys):
            holders = self._holders.get(key)
            if not holders:
                break
            self._holders.move_to_end(key)
            alive = set(holders) if alive is None else alive & holders.keys()
            if not alive:
                break
            for unit in alive:
                depth[unit] = n + 1
        return depth

    def _leave(self, unit: str, key: int, *, forget_hash: bool = True) -> None:
        """`unit` no longer holds `key` (its engine-hash entry too, unless the caller took it)."""
        holders = self._holders.get(key)
        if holders is None:
            return
        engine_hash = holders.pop(unit, None)
        if forget_hash and engine_hash is not None:
            self._keys.get(unit, {}).pop(engine_hash, None)
        if not holders:
            del self._holders[key]

    def _bound(self) -> None:
        while len(self._holders) > self.capacity:
            _, holders = self._holders.popitem(last=False)
            for unit, engine_hash in holders.items():
                self._keys.get(unit, {}).pop(engine_hash, None)
