"""Section 2: the events one gateway process keeps up with, and section 4: what a fleet's
events cost each worker process that subscribes to them.

A subscriber's work per batch is `wire.read_frame` (msgpack to plain values, checked) then
`KvIndex.apply`; both are timed here on frames encoded as vLLM 0.32 sends them, into an index
held full (`STEADY` blocks), so that every stored block also evicts one, as in a gateway that
has run a while. The frames of a round are read once alone, then read and applied batch by
batch as the subscriber does; the difference is the apply's share.

Shapes, per batch (one engine step): `events x blocks` each. A decoding request fills a block
every `block_size` tokens, so a step of a busy unit stores a few one-block events (`8 x 1`);
a prefill stores the prompt's blocks in one event (`1 x 16`, `1 x 64`). Each event continues
its request's chain (its parent the request's last block) until the request has 64 blocks.
Eviction is one event per block (`8 x 1`, `64 x 1` removed).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.kvevents.index import KvIndex
from gateway.kvevents.wire import Stored, read_frame
from loadtest.bench.kv_costs.frames import Chains, frame, removed, stored

STEADY = 100_000
REQUEST_BLOCKS = 64
ROUNDS = 7
UNIT = "u"
REMOVED_SIZE = 16  # a removal carries no tokens: the size only shapes the blocks it removes


@dataclass(frozen=True, slots=True)
class Shape:
    kind: str  # "stored" or "removed"
    events: int  # per batch
    blocks: int  # per event

    @property
    def label(self) -> str:
        return f"{self.events} x {self.blocks}"


STORED = (
    Shape("stored", 1, 1),
    Shape("stored", 8, 1),
    Shape("stored", 1, 16),
    Shape("stored", 1, 64),
)
REMOVED = (Shape("removed", 8, 1), Shape("removed", 64, 1))
# Section 4's two regimes: blocks filled by decoding, or by prefills; the eviction each brings.
REGIMES = {"decode": ("8 x 1", "8 x 1"), "prefill": ("1 x 64", "64 x 1")}


def steady_index(chains: Chains, size: int, steady: int = STEADY) -> KvIndex:
    """An index holding `steady` blocks of one unit, as many as it may: full."""
    index = KvIndex(steady)
    for chain in chains.chains(steady, size):
        index.stored(UNIT, Stored(tuple(chain.hashes), None, tuple(chain.tokens), size))
    return index


def stored_frames(chains: Chains, shape: Shape, size: int, batches: int) -> list[list[bytes]]:
    """`batches` batches of `shape`, each event continuing one of `shape.events` requests."""
    last: list[int | None] = [None] * shape.events
    length = [0] * shape.events
    out = []
    for seq in range(batches):
        events = []
        for r in range(shape.events):
            chain = chains.chain(shape.blocks, size)
            events.append(stored(chain.hashes, last[r], chain.tokens, size))
            length[r] += shape.blocks
            last[r] = chain.hashes[-1] if length[r] < REQUEST_BLOCKS else None
            length[r] %= REQUEST_BLOCKS
        out.append(frame(seq, events))
    return out


def removed_frames(index: KvIndex, chains: Chains, shape: Shape, batches: int) -> list[list[bytes]]:
    """Batches removing blocks the index holds (stored first, untimed)."""
    hashes: list[int] = []
    for chain in chains.chains(batches * shape.events, REMOVED_SIZE):
        stored_event = Stored(tuple(chain.hashes), None, tuple(chain.tokens), REMOVED_SIZE)
        index.stored(UNIT, stored_event)
        hashes += chain.hashes
    n = shape.events
    return [frame(b, [removed(h) for h in hashes[b * n : (b + 1) * n]]) for b in range(batches)]


def _round(index: KvIndex, frames: Sequence[list[bytes]]) -> tuple[float, float]:
    """CPU ns to read the frames alone, and to read and apply them as a subscriber does."""
    start = time.process_time_ns()
    for message in frames:
        read_frame(message)
    read = time.process_time_ns() - start
    start = time.process_time_ns()
    for message in frames:
        index.apply(UNIT, read_frame(message))
    return read, time.process_time_ns() - start


def measure(
    index: KvIndex, chains: Chains, shape: Shape, size: int, tokens: int, rounds: int = ROUNDS
) -> dict[str, Any]:
    """One shape at one block size into `index` (held full): blocks of about `tokens` token ids
    a round (removals: as many blocks as 16-token blocks would be), the fastest round kept
    (timing.py says why)."""
    per_batch = shape.events * shape.blocks
    batches = max(1, tokens // size // per_batch)
    reads, totals = [], []
    for _ in range(rounds):
        if shape.kind == "stored":
            frames = stored_frames(chains, shape, size, batches)
        else:
            frames = removed_frames(index, chains, shape, batches)
        read_ns, total_ns = _round(index, frames)
        reads.append(read_ns / 1e3 / (batches * per_batch))
        totals.append(total_ns / 1e3 / (batches * per_batch))
    us = min(totals)
    read = min(*reads, us)
    return {
        "kind": shape.kind,
        "shape": shape.label,
        "block_size": size if shape.kind == "stored" else None,
        "blocks_per_batch": per_batch,
        "blocks_per_round": batches * per_batch,
        "read_us_per_block": read,
        "apply_us_per_block": us - read,
        "us_per_block": us,
        "blocks_per_s": 1e6 / us,
        "batches_per_s": 1e6 / (us * per_batch),
    }


def run(sizes: Sequence[int], tokens: int, seed: int, steady: int = STEADY) -> list[dict[str, Any]]:
    """Every shape at each block size, each size into an index of its own held full."""
    chains = Chains(seed)
    rows = []
    for size in sizes:
        index = steady_index(chains, size, steady)
        rows += [measure(index, chains, shape, size, tokens) for shape in STORED]
    index = steady_index(chains, REMOVED_SIZE, steady)
    return rows + [measure(index, chains, s, REMOVED_SIZE, tokens) for s in REMOVED]


def worker_share(
    rows: Sequence[dict[str, Any]], units: int, loads: Sequence[tuple[int, float]]
) -> list[dict[str, Any]]:
    """Section 4: the CPU cores each gateway process that subscribes spends on the events of
    `units` units, each storing (and, its cache full, evicting) blocks at each (block size,
    blocks a second per unit) of `loads`, in each regime; the reading is what a subscriber in the
    control plane could take off the workers, apply what each worker's own index still costs."""
    removal = {r["shape"]: r for r in rows if r["kind"] == "removed"}
    out = []
    for size, per_unit in loads:
        by_shape = {r["shape"]: r for r in rows if r["block_size"] == size}
        for regime, (stores, evictions) in REGIMES.items():
            s, e = by_shape[stores], removal[evictions]
            rate = units * per_unit
            us = s["us_per_block"] + e["us_per_block"]
            read = s["read_us_per_block"] + e["read_us_per_block"]
            out.append(
                {
                    "block_size": size,
                    "regime": regime,
                    "units": units,
                    "blocks_per_s_per_unit": per_unit,
                    "tokens_per_s_per_unit": per_unit * size,
                    "us_per_block": us,
                    "cores_per_worker": rate * us / 1e6,
                    "read_cores_per_worker": rate * read / 1e6,
                    "apply_cores_per_worker": rate * (us - read) / 1e6,
                }
            )
    return out
