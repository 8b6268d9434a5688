"""The prefix cache's KV events on the wire (engine/prefixcache/wire.py, publisher.py): vLLM
0.32's encoding, its PUB/ROUTER protocol read back with real ZMQ sockets on loopback, the
gateway's own subscriber (gateway/kvevents) indexing a builtin pool's blocks from them, and
vLLM's own event classes decoding them (in .venv-vllm, skipped where it is not built)."""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from engine.prefixcache import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CacheEvent,
    KVBlockPool,
    block_hashes,
    external,
)
from engine.prefixcache.publisher import END_SEQ, KVEventPublisher
from engine.prefixcache.wire import batch
from gateway.kvevents.index import KvIndex
from gateway.kvevents.keys import block_keys
from gateway.kvevents.subscriber import Source, Subscriber
from gateway.kvevents.wire import Cleared, Removed, Stored, read_frame

BS = 16
ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "tcp://127.0.0.1:0"


def wait_for(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.01)


@pytest.fixture
def publisher() -> Iterator[KVEventPublisher]:
    pub = KVEventPublisher(LOOPBACK, replay_endpoint=LOOPBACK, topic="kv", poll_interval=0.01)
    yield pub
    pub.close()


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


class Engine:
    """A pool whose events are published a step at a time, as the engine loop would."""

    def __init__(self, publisher: KVEventPublisher, num_blocks: int = 8) -> None:
        self.pending: list[CacheEvent] = []
        self.pool = KVBlockPool(num_blocks, BS, on_event=self.pending.append)
        self.publisher = publisher

    def step(self) -> int | None:
        seq = self.publisher.publish(self.pending)
        self.pending.clear()
        return seq

    def prefill(self, seq_id: int, prompt: list[int]) -> None:
        self.pool.allocate(seq_id, prompt)
        self.pool.computed(seq_id, len(prompt))
        self.step()


def prompt(first: int, length: int) -> list[int]:
    return list(range(first, first + length))


# --- the encoding ------------------------------------------------------------------------


def test_a_batch_is_an_array_of_typed_maps_as_vllm_0_32_encodes_it() -> None:
    hashes = block_hashes(prompt(0, 32), BS)
    events: list[CacheEvent] = [
        BlockStored((hashes[1],), hashes[0], tuple(prompt(16, 16)), BS),
        BlockRemoved((hashes[0],)),
        AllBlocksCleared(),
    ]
    payload = msgspec.msgpack.encode(batch(events, ts=1.5))
    ts, decoded, rank = msgspec.msgpack.decode(payload)
    assert (ts, rank) == (1.5, 0)
    stored, removed, cleared = decoded
    assert list(stored.items()) == [
        ("type", "BlockStored"),
        ("block_hashes", [external(hashes[1])]),
        ("parent_block_hash", external(hashes[0])),
        ("token_ids", prompt(16, 16)),
        ("block_size", BS),
        ("lora_id", None),
        ("medium", "GPU"),
        ("lora_name", None),
        ("extra_keys", [None]),
        ("group_idx", 0),
    ]
    assert removed == {
        "type": "BlockRemoved",
        "block_hashes": [external(hashes[0])],
        "medium": "GPU",
        "group_idx": 0,
    }
    assert cleared == {"type": "AllBlocksCleared"}


def test_the_gateways_reader_reads_a_frame() -> None:
    hashes = block_hashes(prompt(0, 32), BS)
    events: list[CacheEvent] = [
        BlockStored(tuple(hashes), None, tuple(prompt(0, 32)), BS),
        BlockRemoved((hashes[1],)),
        AllBlocksCleared(),
    ]
    payload = msgspec.msgpack.encode(batch(events, ts=2.0))
    read = read_frame([b"kv", (7).to_bytes(8, "big"), payload])
    ext = tuple(external(h) for h in hashes)
    assert (read.seq, read.ts) == (7, 2.0)
    assert read.events == (Stored(ext, None, tuple(prompt(0, 32)), BS), Removed(ext[1:]), Cleared())


# --- the sockets -------------------------------------------------------------------------


def subscribe(context: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


def receive(sock: zmq.Socket[bytes], within: float = 10.0) -> list[bytes]:
    assert sock.poll(int(within * 1000)), "nothing received within the deadline"
    return sock.recv_multipart()


def replay(
    context: zmq.Context[zmq.Socket[bytes]], endpoint: str, start: int | bytes
) -> list[list[bytes]]:
    """Every message of one replay, its end marker last."""
    dealer = context.socket(zmq.DEALER)
    dealer.connect(endpoint)
    request = start if isinstance(start, bytes) else start.to_bytes(8, "big")
    dealer.send_multipart([b"", request])
    got = [receive(dealer)]
    while got[-1][2] != END_SEQ:
        got.append(receive(dealer))
    dealer.close(linger=0)
    return got


def test_live_batches_come_numbered_in_order(
    publisher: KVEventPublisher, context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    sub = subscribe(context, publisher.endpoint)
    engine = Engine(publisher)
    # A SUB socket hears only what is sent once its subscription arrived: a first batch is
    # sent until one is heard (its number tells which).
    first = -1
    deadline = time.monotonic() + 10
    while first < 0:
        assert time.monotonic() < deadline, "the subscription never arrived"
        engine.pending.append(AllBlocksCleared())
        engine.step()
        if sub.poll(50):
            first = int.from_bytes(sub.recv_multipart()[1], "big")
    while sub.poll(200):  # the probes sent meanwhile
        first = int.from_bytes(sub.recv_multipart()[1], "big")
    engine.prefill(1, prompt(0, 40))
    engine.prefill(2, prompt(100, 20))
    frames = [receive(sub), receive(sub)]
    assert [f[0] for f in frames] == [b"kv", b"kv"]
    batches = [read_frame(f) for f in frames]
    assert [b.seq for b in batches] == [first + 1, first + 2]
    (stored,) = batches[0].events
    assert isinstance(stored, Stored) and stored.token_ids == tuple(prompt(0, 32))
    assert publisher.publish([]) is None  # a quiet step sends nothing, as vLLM's


def test_the_replay_socket_returns_what_was_missed(
    publisher: KVEventPublisher, context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    engine = Engine(publisher, num_blocks=32)
    for i in range(5):
        engine.prefill(i, prompt(1000 * i, 17))
    wait_for(lambda: publisher.published == 5)
    got = replay(context, publisher.replay_endpoint or "", 2)
    assert [m[0] for m in got] == [b""] * 4
    assert [int.from_bytes(m[2], "big") for m in got[:-1]] == [2, 3, 4]
    assert got[-1] == [b"", b"", END_SEQ, b""]
    tokens = [read_frame(m[1:]).events[0] for m in got[:-1]]
    assert [e.token_ids[0] for e in tokens if isinstance(e, Stored)] == [2000, 3000, 4000]
    assert replay(context, publisher.replay_endpoint or "", 5) == [[b"", b"", END_SEQ, b""]]


def test_only_the_last_batches_are_kept_and_a_bad_request_is_ignored(
    context: zmq.Context[zmq.Socket[bytes]],
) -> None:
    with KVEventPublisher(
        LOOPBACK, replay_endpoint=LOOPBACK, buffer_steps=2, poll_interval=0.01
    ) as pub:
        for _ in range(5):
            pub.publish([AllBlocksCleared()])
        wait_for(lambda: pub.published == 5)
        assert pub.replay_endpoint is not None
        bad = context.socket(zmq.DEALER)
        bad.connect(pub.replay_endpoint)
        bad.send_multipart([b"", b"one", b"two"])
        got = replay(context, pub.replay_endpoint, 0)
        assert [int.from_bytes(m[2], "big") for m in got[:-1]] == [3, 4]
        assert pub.replays == 1 and not bad.poll(100)
        bad.close(linger=0)


def test_a_full_queue_drops_a_batch_and_skips_its_number(
    context: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """`publish()` never waits for the thread: a batch the full queue refuses is dropped,
    its number skipped, so a subscriber sees the gap (however many a burst loses)."""
    with KVEventPublisher(
        LOOPBACK, replay_endpoint=LOOPBACK, max_queue_size=1, buffer_steps=5_000
    ) as pub:
        sent = [pub.publish([AllBlocksCleared()]) for _ in range(2_000)]
        wait_for(lambda: pub.published + pub.dropped == 2_000)
        assert pub.replay_endpoint is not None
        got = replay(context, pub.replay_endpoint, 0)
        kept = [int.from_bytes(m[2], "big") for m in got[:-1]]
        assert kept == [seq for seq in sent if seq is not None]
        assert sent.count(None) == pub.dropped and len(kept) == pub.published


def test_a_closed_publisher_refuses_batches_and_frees_its_address() -> None:
    pub = KVEventPublisher(LOOPBACK)
    with pytest.raises(zmq.ZMQError):
        KVEventPublisher(pub.endpoint)  # taken
    pub.close()
    pub.close()
    with pytest.raises(RuntimeError, match="closed"):
        pub.publish([AllBlocksCleared()])
    KVEventPublisher(pub.endpoint).close()  # free again
    with pytest.raises(ValueError, match="max_queue_size: 0"):
        KVEventPublisher(LOOPBACK, max_queue_size=0)


# --- the gateway's subscriber --------------------------------------------------------------


async def until(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.01)


async def test_the_gateways_subscriber_indexes_a_builtin_pools_blocks(
    publisher: KVEventPublisher,
) -> None:
    """History replayed on connecting, then live batches: stored blocks (decoded ones too),
    evictions and a reset, all as the gateway's index keys them."""
    engine = Engine(publisher, num_blocks=6)
    engine.prefill(1, prompt(0, 40))  # blocks 0..31 stored, before the gateway subscribed
    index = KvIndex(10_000)
    context = zmq.asyncio.Context()
    source = Source("builtin", publisher.endpoint, publisher.replay_endpoint or "")
    sub = Subscriber(source, index, context, lambda *_: None, poll_interval=0.05)
    task = asyncio.create_task(sub.run())

    def depth(tokens: list[int]) -> int:
        return index.match(block_keys(tokens, BS)).get("builtin", 0)

    try:
        await until(lambda: sub.trusted and depth(prompt(0, 48)) == 2)
        assert sub.replayed == 1
        for token in range(40, 49):  # decode: block 32..47 fills and is fed
            engine.pool.append(1, token)
        engine.step()
        await until(lambda: depth(prompt(0, 64)) == 3)
        engine.pool.free(1)
        engine.prefill(2, prompt(500, 96))  # all 6 blocks: 1's 3 cached ones are evicted
        await until(lambda: depth(prompt(500, 96)) == 6)
        assert depth(prompt(0, 48)) == 0
        engine.pool.free(2)
        assert engine.pool.reset()
        engine.step()
        await until(lambda: depth(prompt(500, 96)) == 0)
        assert sub.garbage == 0 and sub.dropped == 0 and index.orphans == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        context.term()


# --- vLLM's own classes ------------------------------------------------------------------

VLLM_PYTHON = Path(os.environ.get("UNITGATE_VLLM_VENV", ROOT / ".venv-vllm")) / "bin" / "python"
VLLM_READY = VLLM_PYTHON.parent.parent / ".installed-vllm"  # the Makefile's stamp

# Run by .venv-vllm's Python: replays the publisher's history, then reads live batches, and
# decodes every payload with vLLM's KVEventBatch; re-encodes it with vLLM's encoder; chains
# vLLM's own block hashes over each stored block's token ids.
READER = """
import json, sys, time
import msgspec, zmq
from vllm.distributed.kv_events import KVEventBatch
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash, maybe_convert_block_hash

endpoint, replay_endpoint, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
init_none_hash(sha256)
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.connect(endpoint)
frames = {}

def replay(start):
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    while True:
        assert dealer.poll(10_000), "no replay"
        _, topic, seq, payload = dealer.recv_multipart()
        if seq == (-1).to_bytes(8, "big", signed=True):
            break
        frames[int.from_bytes(seq, "big")] = (topic, payload)
    dealer.close(linger=0)

replay(0)
print("replayed", flush=True)
deadline = time.monotonic() + 30
while len(frames) < count:
    assert time.monotonic() < deadline, "the live batches never came"
    if sub.poll(2_000):
        topic, seq, payload = sub.recv_multipart()
        frames[int.from_bytes(seq, "big")] = (topic, payload)
    else:
        replay(len(frames))
decoder, encoder = msgspec.msgpack.Decoder(KVEventBatch), msgspec.msgpack.Encoder()
vllm_hash = {}
out = []
for seq, (topic, payload) in sorted(frames.items()):
    batch = decoder.decode(payload)
    events = []
    for event in batch.events:
        fields = {f: getattr(event, f) for f in event.__struct_fields__}
        if type(event).__name__ == "BlockStored":
            parent = vllm_hash.get(event.parent_block_hash)
            ours = []
            for i in range(len(event.block_hashes)):
                tokens = event.token_ids[i * event.block_size : (i + 1) * event.block_size]
                parent = hash_block_tokens(sha256, parent, tokens)
                vllm_hash[maybe_convert_block_hash(parent)] = parent
                ours.append(maybe_convert_block_hash(parent))
            fields["vllm_hashes"] = ours
        events.append({"type": type(event).__name__, **fields})
    out.append({
        "topic": topic.decode(), "seq": seq, "ts": batch.ts, "rank": batch.data_parallel_rank,
        "same_bytes": encoder.encode(batch) == payload, "events": events,
    })
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.timeout(300)
def test_vllms_own_classes_decode_the_events(publisher: KVEventPublisher, tmp_path: Path) -> None:
    if not (VLLM_PYTHON.exists() and VLLM_READY.exists()):
        pytest.skip(f"no vLLM venv at {VLLM_PYTHON.parent.parent} (`make vllm-env` builds it)")
    engine = Engine(publisher, num_blocks=6)
    engine.prefill(1, prompt(0, 40))  # BlockStored, 2 blocks
    for token in range(40, 49):
        engine.pool.append(1, token)
    engine.step()  # BlockStored, its parent the block before
    engine.pool.free(1)
    engine.prefill(2, prompt(500, 96))  # BlockRemoved x3, then BlockStored
    engine.pool.free(2)
    engine.pool.reset()
    engine.step()  # AllBlocksCleared
    script = tmp_path / "read_events.py"
    script.write_text(READER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    reader = subprocess.Popen(
        [str(VLLM_PYTHON), str(script), publisher.endpoint, publisher.replay_endpoint or "", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        assert reader.stdout is not None
        ready, _, _ = select.select([reader.stdout], [], [], 180)
        assert ready and reader.stdout.readline().strip() == "replayed"
        engine.prefill(3, prompt(900, 33))  # a live batch
        out, err = reader.communicate(timeout=60)
    finally:
        reader.kill()
        reader.wait(10)
    assert reader.returncode == 0, err[-3000:]
    (line,) = [line for line in out.splitlines() if line.startswith("RESULT ")]
    batches: list[dict[str, Any]] = json.loads(line.removeprefix("RESULT "))
    assert [b["seq"] for b in batches] == [0, 1, 2, 3, 4]
    assert all(b["same_bytes"] and b["topic"] == "kv" and b["rank"] == 0 for b in batches)
    kinds = [[e["type"] for e in b["events"]] for b in batches]
    assert kinds == [
        ["BlockStored"],
        ["BlockStored"],
        ["BlockRemoved"] * 3 + ["BlockStored"],
        ["AllBlocksCleared"],
        ["BlockStored"],
    ]
    stored = [e for b in batches for e in b["events"] if e["type"] == "BlockStored"]
    for event in stored:  # the same hashes as vLLM's, of the token ids the gateway keys on
        assert event["block_hashes"] == event["vllm_hashes"]
        assert event["block_size"] == BS and event["medium"] == "GPU"
        assert event["extra_keys"] == [None] * len(event["block_hashes"])
    assert stored[0]["token_ids"] == prompt(0, 32) and stored[0]["parent_block_hash"] is None
    assert stored[1]["parent_block_hash"] == stored[0]["block_hashes"][1]
