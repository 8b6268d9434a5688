"""The step message: what the leader broadcasts so followers run the same forward pass.

Wire format, all int64, broadcast from rank 0:
  header (7 values): command, number of entries, total tokens, number of forks, pending,
                     slots used, number of table values
  body:              slot, start_pos, length for each entry; src, dst, length for each fork;
                     slot, first, count, then `count` block ids for each table edit; then
                     all token ids
Both travel in one fixed frame of FRAME_SIZE values (a decode step at batch 8 is 32 body
values); a body too big for the frame (a long prefill) follows in a second broadcast, sized
from the header. Followers therefore always know how much to receive.
Every rank applies the table edits before the forward (a slot's block table: where its
positions live in the paged KV cache), so only what changed travels: a sequence's whole
table when it starts, one entry when a decode starts a new block.
A fork copies a prompt's partial last block into a child's own block after the forward (a
request's n choices share one prefill); forks only ever come with the prefill that writes
their source.
Sampling stays on the leader, so no sampling parameters travel. `pending` and `slots used`
ride along so a follower's /health reports the unit's load without asking the leader.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

HEADER_SIZE = 7
# One broadcast costs a network round of latency whatever its size at this scale (measured on
# loopback: 8 KB in one broadcast ~0.35 ms, header + body in two ~1.15 ms), so the header and a
# body of up to FRAME_SIZE - 6 values travel together; only a big prefill needs a second one.
FRAME_SIZE = 1024
Entry = tuple[int, tuple[int, ...], int]  # (slot, token ids, start_pos), as Transformer.forward
ForkValues = tuple[int, int, int]  # (src, dst, length) blocks, as engine.prefixcache.BlockCopy
EditValues = tuple[int, int, tuple[int, ...]]  # (slot, first, blocks), as TableEdit


class Command(enum.IntEnum):
    STEP = 1  # run model.forward on the entries
    HEARTBEAT = 2  # nothing to run; proves the leader is alive while it is idle
    STOP = 3  # exit cleanly


@dataclass(frozen=True, slots=True)
class StepMessage:
    command: Command
    entries: tuple[Entry, ...] = ()
    pending: int = 0
    slots_used: int = 0
    forks: tuple[ForkValues, ...] = ()  # applied after the forward, on every rank
    tables: tuple[EditValues, ...] = ()  # applied before the forward, on every rank

    @classmethod
    def step(
        cls,
        entries: Sequence[tuple[int, Sequence[int], int]],
        pending: int,
        slots_used: int,
        forks: Sequence[Sequence[int]] = (),
        tables: Sequence[tuple[int, int, Sequence[int]]] = (),
    ) -> StepMessage:
        frozen = tuple((slot, tuple(ids), start) for slot, ids, start in entries)
        copies = tuple((src, dst, length) for src, dst, length in forks)
        edits = tuple((slot, first, tuple(blocks)) for slot, first, blocks in tables)
        return cls(Command.STEP, frozen, pending, slots_used, copies, edits)


def encode(msg: StepMessage) -> tuple[torch.Tensor, torch.Tensor]:
    """(header, body) tensors; the body is empty for commands without entries."""
    values = _values(msg)
    return torch.tensor(values[:HEADER_SIZE]), torch.tensor(values[HEADER_SIZE:])


def _values(msg: StepMessage) -> list[int]:
    """Header then body, as one list: one tensor conversion per send."""
    meta: list[int] = []
    tokens: list[int] = []
    for slot, ids, start in msg.entries:
        meta += (slot, start, len(ids))
        tokens += ids
    for fork in msg.forks:
        meta += fork
    before = len(meta)
    for slot, first, blocks in msg.tables:
        meta += (slot, first, len(blocks), *blocks)
    counts = [len(msg.entries), len(tokens), len(msg.forks)]
    loads = [msg.pending, msg.slots_used, len(meta) - before]
    return [int(msg.command), *counts, *loads, *meta, *tokens]


def decode(header: torch.Tensor, body: torch.Tensor) -> StepMessage:
    return _decode(header.tolist(), body.tolist())


def _decode(header: list[int], values: list[int]) -> StepMessage:
    command, n_entries, _, n_forks, pending, slots_used, n_tables = header
    if len(values) != _body_size(header):
        raise ValueError(f"step message: body has {len(values)} values, header says otherwise")
    entries: list[Entry] = []
    offset = 3 * (n_entries + n_forks)
    edits: list[EditValues] = []
    end = offset + n_tables
    while offset < end:
        slot, first, count = values[offset : offset + 3]
        edits.append((slot, first, tuple(values[offset + 3 : offset + 3 + count])))
        offset += 3 + count
    for i in range(n_entries):
        slot, start, length = values[3 * i : 3 * i + 3]
        entries.append((slot, tuple(values[offset : offset + length]), start))
        offset += length
    forks = tuple(
        (values[i], values[i + 1], values[i + 2])
        for i in range(3 * n_entries, 3 * (n_entries + n_forks), 3)
    )
    return StepMessage(Command(command), tuple(entries), pending, slots_used, forks, tuple(edits))


def _body_size(header: list[int]) -> int:
    """3 values per entry and per fork, the table values, then the tokens."""
    return 3 * (header[1] + header[3]) + header[6] + header[2]


def send(msg: StepMessage, group: dist.ProcessGroup | None = None) -> None:
    """Leader side: one broadcast of the frame, a second only for a body that overflows it.

    Only the values travel that the header announces; the rest of the frame is never read,
    so it is neither zeroed nor copied (two fewer tensor ops on the step's critical path)."""
    frame, body = frames(msg)
    dist.broadcast(frame, src=0, group=group)
    if body is not None:
        dist.broadcast(body, src=0, group=group)


def frames(msg: StepMessage) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`msg` as it travels: its frame, and the body that follows it when the frame cannot
    hold every value (None when it can)."""
    values = _values(msg)
    inline = len(values) <= FRAME_SIZE
    head = values if inline else values[:HEADER_SIZE]
    frame = torch.empty(FRAME_SIZE, dtype=torch.int64)
    frame[: len(head)] = torch.tensor(head, dtype=torch.int64)
    return frame, None if inline else torch.tensor(values[HEADER_SIZE:], dtype=torch.int64)


def receive(group: dist.ProcessGroup | None = None) -> StepMessage:
    """Follower side: blocks until the leader sends, or raises when Gloo's timeout passes."""
    frame = torch.empty(FRAME_SIZE, dtype=torch.int64)
    dist.broadcast(frame, src=0, group=group)
    return read_frame(frame, lambda body: dist.broadcast(body, src=0, group=group))


def read_frame(frame: torch.Tensor, fill_body: Callable[[torch.Tensor], object]) -> StepMessage:
    """The message a received frame holds; one that overflows it has a body after it, which
    `fill_body` receives into the tensor it is given (by the frame's own transport)."""
    header = frame[:HEADER_SIZE].tolist()
    size = _body_size(header)
    if HEADER_SIZE + size <= FRAME_SIZE:
        return _decode(header, frame[HEADER_SIZE : HEADER_SIZE + size].tolist())
    body = torch.empty(size, dtype=torch.int64)
    fill_body(body)
    return _decode(header, body.tolist())


# The step channel's two ends as the runtime calls them. LeaderEngine and run_follower take
# them as arguments (by default the functions above), so a benchmark can time the channel
# without patching this module.
Send = Callable[[StepMessage, "dist.ProcessGroup | None"], None]
Receive = Callable[["dist.ProcessGroup | None"], StepMessage]
