"""The gateway's subscriber against vLLM's own publisher (ZmqEventPublisher: its PUB socket,
its replay buffer and ROUTER socket, its publishing thread), on sockets in a temporary folder.
Starts no engine: the batches are vLLM's event classes, published as an engine publishes them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq.asyncio

from gateway.kvevents.index import KvIndex
from gateway.kvevents.keys import block_keys
from gateway.kvevents.subscriber import Source, Subscriber

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("vllm_required")]

BLOCK = 4


def publisher(tmp: Path, **kwargs: Any) -> Any:
    from vllm.distributed.kv_events import ZmqEventPublisher

    return ZmqEventPublisher(
        0, endpoint=f"ipc://{tmp}/pub", replay_endpoint=f"ipc://{tmp}/replay", **kwargs
    )


def stored(prompt: int, blocks: int) -> Any:
    """A prompt's blocks as the engine stores them: `prompt` picks its tokens; each block's
    engine hash is made up (the gateway only maps it), its parent the block before."""
    from vllm.distributed.kv_events import BlockStored, KVEventBatch

    tokens = [prompt * 1000 + i for i in range(blocks * BLOCK)]
    hashes = [prompt * 1000 + b for b in range(blocks)]
    return KVEventBatch(
        ts=time.time(),
        events=[
            BlockStored(
                block_hashes=hashes,
                parent_block_hash=None,
                token_ids=tokens,
                block_size=BLOCK,
                lora_id=None,
                medium="CPU",
                lora_name=None,
            )
        ],
    )


def keys_of(prompt: int, blocks: int) -> list[int]:
    return block_keys([prompt * 1000 + i for i in range(blocks * BLOCK)], BLOCK)


async def until(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.01)


class Running:
    def __init__(self, tmp: Path, replay: bool = True, **kwargs: Any) -> None:
        self.index = KvIndex(1_000_000)
        self.trust: list[tuple[bool, str]] = []
        self.context = zmq.asyncio.Context()
        source = Source("u0", f"ipc://{tmp}/pub", f"ipc://{tmp}/replay" if replay else "")
        self.sub = Subscriber(
            source,
            self.index,
            self.context,
            lambda u, t, why: self.trust.append((t, why)),
            poll_interval=0.05,
            **kwargs,
        )
        self.task = asyncio.create_task(self.sub.run())

    def holds(self, prompt: int, blocks: int) -> bool:
        return self.index.match(keys_of(prompt, blocks)).get("u0") == blocks

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.context.term()


async def test_the_engines_history_is_replayed_and_live_batches_follow(tmp_path: Path) -> None:
    pub = publisher(tmp_path)
    running = None
    try:
        for prompt in range(5):  # before the gateway subscribed
            pub.publish(stored(prompt, 3))
        await until(lambda: len(pub._buffer) == 5)
        running = Running(tmp_path)
        await until(lambda: running.sub.trusted)
        assert all(running.holds(p, 3) for p in range(5)), "the history was not replayed"
        pub.publish(stored(7, 2))
        await until(lambda: running.holds(7, 2))
        assert running.sub.order.last == 5 and running.sub.garbage == 0
        assert running.trust == [(True, "connected")]
    finally:
        if running is not None:
            await running.stop()
        pub.shutdown()


async def test_events_of_another_model_make_the_unit_untrusted_until_its_own_come(
    tmp_path: Path,
) -> None:
    """A publisher whose token ids run past the unit's model's vocabulary is another model's
    (a unit pointed at the wrong publisher, a model swapped under the gateway): its batches
    are not applied, the unit is routed approximately, said once in the log (the trust hook)
    and on a metric (`foreign`); a batch of its own model's trusts it again."""
    pub = publisher(tmp_path)
    running = None
    try:
        running = Running(tmp_path, vocabulary=50_000)
        await until(lambda: running.sub.trusted)
        pub.publish(stored(60, 2))  # token ids from 60,000: past 50,000
        await until(lambda: running.sub.foreign == 1)
        assert not running.sub.trusted and not running.holds(60, 2)
        assert running.trust[-1] == (
            False,
            "events of another model: token id 60007, where its model's tokenizer has 50000",
        )
        pub.publish(stored(61, 1))
        await until(lambda: running.sub.foreign == 2)
        assert [t for t, _ in running.trust] == [True, False]  # said once
        pub.publish(stored(3, 2))  # its own model's again
        await until(lambda: running.holds(3, 2) and running.sub.trusted)
        assert running.sub.garbage == 0 and running.sub.dropped == 0
    finally:
        if running is not None:
            await running.stop()
        pub.shutdown()


async def test_batches_the_socket_dropped_are_replayed(tmp_path: Path) -> None:
    """A publisher whose queue to a slow subscriber holds 5 messages (vLLM's `hwm`) drops the
    rest while the gateway's loop is busy; the next batch that arrives shows the gap and the
    replay socket fills it."""
    pub = publisher(tmp_path, hwm=5)
    running = Running(tmp_path, hwm=5)
    try:
        await until(lambda: running.sub.trusted)
        time.sleep(0.2)  # the loop blocked: nothing is read while...
        for prompt in range(300):  # ... the engine publishes
            pub.publish(stored(prompt, 1))
        await until(lambda: len(pub._buffer) == 300)
        time.sleep(0.2)
        await until(lambda: running.sub.order.last == 299)
        assert all(running.holds(p, 1) for p in range(300))
        assert running.sub.replayed > 0, "nothing was dropped: the test did not test a gap"
        assert running.sub.dropped == 0
    finally:
        await running.stop()
        pub.shutdown()


async def test_a_restarted_engine_drops_the_units_entries_and_rebuilds_them(tmp_path: Path) -> None:
    pub = publisher(tmp_path)
    running = Running(tmp_path)
    try:
        await until(lambda: running.sub.trusted)
        pub.publish(stored(1, 2))
        await until(lambda: running.holds(1, 2))
        pub.shutdown()
        await until(lambda: not running.sub.trusted)
        pub = publisher(tmp_path)  # the same endpoints; its count begins again at 0
        pub.publish(stored(2, 2))
        await until(lambda: running.holds(2, 2))
        assert not running.holds(1, 1), "the old engine's blocks stayed"
        assert running.sub.dropped == 1
        await until(lambda: running.sub.trusted)
    finally:
        await running.stop()
        pub.shutdown()


async def test_without_a_replay_socket_a_gap_drops_the_entries_and_goes_on(tmp_path: Path) -> None:
    pub = publisher(tmp_path, hwm=5)
    running = Running(tmp_path, replay=False, hwm=5)
    try:
        await until(lambda: running.sub.trusted)
        time.sleep(0.2)
        for prompt in range(300):
            pub.publish(stored(prompt, 1))
        await until(lambda: len(pub._buffer) == 300)
        time.sleep(0.2)
        pub.publish(stored(300, 1))  # the next batch shows what was lost before it
        await until(lambda: running.sub.order.last == 300)
        assert running.sub.dropped >= 1 and running.sub.replays == 0
        assert running.holds(300, 1), "the stream did not go on after the gap"
        assert not running.holds(150, 1), "what was known before the gap was kept"
    finally:
        await running.stop()
        pub.shutdown()


async def test_a_gateway_reads_the_units_that_name_a_publisher_and_forgets_one_removed(
    tmp_path: Path,
) -> None:
    """Through the gateway: a unit with `kv_events` is subscribed to when the gateway starts;
    one added at run time too; removing a unit cancels its subscriber and drops its entries."""
    from gateway.config import config_from_dict
    from gateway.config.unit import UnitConfig
    from gateway.server import running

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    pubs = [publisher(tmp_path / "a"), publisher(tmp_path / "b")]

    def unit(name: str, **fields: Any) -> dict[str, Any]:
        # a leader nobody answers at: the subscriber does not need the unit routable
        return {"id": name, "leader": "http://127.0.0.1:9", "kind": "vllm", **fields}

    def events(name: str) -> dict[str, str]:
        # With its replay socket, as docs/routing.md configures a unit: a batch published
        # while the new subscription was still reaching the publisher (ZMQ drops what a
        # subscriber has not yet subscribed to) is asked for again at the next quiet poll.
        folder = tmp_path / name
        return {"kv_events": f"ipc://{folder}/pub", "kv_events_replay": f"ipc://{folder}/replay"}

    config = config_from_dict(
        {
            "gateway": {"port": 0, "models": ["m"]},
            "metrics": {"port": 0},
            "admin": {"enabled": False},
            "units": [unit("a", **events("a")), unit("plain")],
        }
    )
    try:
        async with running(config) as gw:
            kv = gw.knowledge.kv
            assert kv is not None and kv.subscriber("plain") is None
            await until(lambda: kv.trusted("a"))
            pubs[0].publish(stored(1, 2))
            await until(lambda: kv.index.match(keys_of(1, 2)) == {"a": 2})
            scrape = gw.metrics.render().decode()
            assert 'unitgate_kv_events_trusted{unit="a"} 1.0' in scrape
            assert 'unitgate_kv_events_batches_total{unit="a"} 1.0' in scrape
            assert "unitgate_kv_index_blocks 2.0" in scrape
            trusted = [ln for ln in scrape.splitlines() if ln.startswith("unitgate_kv_events_t")]
            assert trusted == ['unitgate_kv_events_trusted{unit="a"} 1.0']  # not "plain"

            gw.units.add(UnitConfig(**unit("b", **events("b"))))
            await until(lambda: kv.trusted("b"))
            pubs[1].publish(stored(1, 2))  # the same prompt, cached on b too
            await until(lambda: kv.index.match(keys_of(1, 2)) == {"a": 2, "b": 2})

            gw.units.remove("a")
            assert kv.index.match(keys_of(1, 2)) == {"b": 2}
            assert kv.subscriber("a") is None
        assert gw.knowledge.kv is None
    finally:
        for pub in pubs:
            pub.shutdown()
