"""Section 1: the KV index's memory per block, by the two measures that answer different
questions.

- tracemalloc: the bytes Python's allocators handed the index and did not get back. Exact and
  the index's alone (each batch decoded on the way is freed before the reading), so it is the
  figure to size `kv_index_blocks` by; taken at the smaller size, since tracing slows every
  allocation and keeps a trace of every object.
- RSS (/proc/self/statm): what the OS charges the process, pymalloc's arenas and the hash
  tables' growth steps included (a table doubles: its slack depends on where the fill
  stopped). Taken first, at the configured default, before anything big was freed in this
  process: memory freed earlier would be reused and hide part of the growth.

The blocks arrive as in production: frames encoded as vLLM 0.32 sends them, read by
wire.read_frame and applied by KvIndex.apply, one chain (a prompt of 8 to 64 blocks) an event,
so each unit's engine hashes are objects of its own. The index keeps no token ids, so the
block size does not change the figures (16 here).
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from collections.abc import Callable, Iterable
from typing import Any

from gateway.kvevents.index import KvIndex
from gateway.kvevents.wire import read_frame
from loadtest.bench.kv_costs.frames import Chain, Chains, frame, stored

BLOCK_SIZE = 16
MOST_HOLDERS = 4
Meter = Callable[[], int]


def _store(index: KvIndex, units: Iterable[str], chain: Chain, seq: int) -> None:
    """`chain` stored by each of `units`, each reading the frame itself."""
    message = frame(seq, [stored(chain.hashes, None, chain.tokens, chain.size)])
    for unit in units:
        index.apply(unit, read_frame(message))


def _fill(index: KvIndex, unit: str, blocks: int, seed: int) -> None:
    for seq, chain in enumerate(Chains(seed).chains(blocks, BLOCK_SIZE)):
        _store(index, (unit,), chain, seq)


def _fill_mixed(index: KvIndex, blocks: int, seed: int) -> int:
    """Each chain held by 1 to MOST_HOLDERS units; the (block, unit) holdings made."""
    chains, holdings = Chains(seed), 0
    for seq, chain in enumerate(chains.chains(blocks, BLOCK_SIZE)):
        held = chains.holders(MOST_HOLDERS)
        _store(index, (f"u{i}" for i in range(held)), chain, seq)
        holdings += held * len(chain.hashes)
    return holdings


def _row(method: str, blocks: int, holders: str, holdings: int, grew: int) -> dict[str, Any]:
    return {
        "method": method,
        "blocks": blocks,
        "holders": holders,
        "holdings": holdings,
        "bytes": grew,
        "bytes_per_block": grew / blocks,
        "bytes_per_holding": grew / holdings,
    }


def _measure(
    method: str, meter: Meter, blocks: int, seed: int, mixed: bool
) -> list[dict[str, Any]]:
    """Blocks held by one unit, then by a second one too; with `mixed`, a fresh index whose
    chains are held by 1 to 4 units each."""
    gc.collect()
    base = meter()
    index = KvIndex(blocks)
    _fill(index, "a", blocks, seed)
    gc.collect()
    one = meter() - base
    _fill(index, "b", blocks, seed)  # the same prompts: the same blocks, a second holder
    gc.collect()
    two = meter() - base
    assert len(index) == blocks and index.blocks("a") == index.blocks("b") == blocks
    rows = [_row(method, blocks, "1", blocks, one), _row(method, blocks, "2", 2 * blocks, two)]
    del index
    if mixed:
        gc.collect()
        base = meter()
        index = KvIndex(blocks)
        holdings = _fill_mixed(index, blocks, seed + 1)
        gc.collect()
        rows.append(_row(method, blocks, f"1-{MOST_HOLDERS}", holdings, meter() - base))
        del index
    return rows


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def by_rss(blocks: int, seed: int) -> list[dict[str, Any]]:
    return _measure("rss", rss, blocks, seed, mixed=False)


def by_tracemalloc(blocks: int, seed: int) -> list[dict[str, Any]]:
    tracemalloc.start()
    try:
        return _measure(
            "tracemalloc", lambda: tracemalloc.get_traced_memory()[0], blocks, seed, True
        )
    finally:
        tracemalloc.stop()
