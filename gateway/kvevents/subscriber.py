"""One unit's KV event stream, read off its vLLM publisher into the index.

vLLM's publisher binds a PUB socket (`[topic, seq, payload]` messages) and, optionally, a
ROUTER socket that replays its last batches: a client sends `[b"", start]` (start: 8 bytes,
big-endian) and gets `[b"", topic, seq, payload]` for each kept batch from `start` on, then
`[b"", b"", -1, b""]`. The subscriber connects a SUB socket to the first and, when it must
catch up, a DEALER socket to the second; order.py says what each batch means.

- On connecting, it replays from the first batch it lacks (0 the first time: the engine's
  history since its start, as far as the publisher still keeps it). A batch numbered past
  the next one shows a gap, filled the same way; so does a quiet poll (the last batches
  before a pause may be lost with nothing after them to show it).
- A disconnect makes the unit's entries untrusted (routing goes approximate for it); a
  reconnect is taken as a restarted engine (a publisher's socket closes with its process):
  the entries are dropped and rebuilt from a replay from 0.
- A frame that is not vLLM's format is counted and makes the unit untrusted until the next
  good batch (the batch it was is then a gap, filled by replay).

Every wait has a deadline: the sockets are polled `poll_interval` at a time, a replay answers
within `replay_timeout`. The task runs until cancelled; its sockets close with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from gateway.kvevents.index import KvIndex
from gateway.kvevents.order import Order, Step
from gateway.kvevents.wire import Batch, Stored, WireError, read_batch, read_frame, seq_of

log = logging.getLogger("unitgate.kvevents")

END = -1  # the sequence number that ends a replay
MONITORED = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED


@dataclass(frozen=True, slots=True)
class Source:
    unit: str
    endpoint: str  # the publisher's PUB socket, e.g. tcp://10.0.0.5:5557
    replay: str = ""  # its ROUTER socket ("" = none: gaps cannot be filled)


# (unit, trusted, why): the subscriber's verdict on its entries changed
TrustHook = Callable[[str, bool, str], None]


class Subscriber:
    def __init__(
        self,
        source: Source,
        index: KvIndex,
        context: zmq.asyncio.Context,
        on_trust: TrustHook,
        *,
        poll_interval: float = 1.0,
        replay_timeout: float = 2.0,
        hwm: int = 100_000,
        vocabulary: int | None = None,
    ) -> None:
        """`vocabulary`: how many token ids the unit's model has, if the gateway knows its
        tokenizer: a batch naming an id past it is another model's, and not applied."""
        self.source = source
        self.vocabulary = vocabulary
        self.index = index
        self._context = context
        self._on_trust = on_trust
        self._poll_ms = max(1, round(poll_interval * 1000))
        self._replay_timeout_ms = max(1, round(replay_timeout * 1000))
        self._hwm = hwm  # batches queued on the socket at most (vLLM's publisher's default)
        self.order = Order()
        self.trusted = False
        self.connected = False
        self.batches = 0  # applied
        self.garbage = 0  # frames that were not vLLM's format
        self.replays = 0  # asked for
        self.replayed = 0  # batches applied from a replay
        self.dropped = 0  # times the unit's entries were dropped (restart, unfilled gap)
        self.foreign = 0  # batches of another model's (token ids past its vocabulary)
        self._ever_connected = False
        self._broken = False  # a bad frame since the last good batch

    @property
    def unit(self) -> str:
        return self.source.unit

    async def run(self) -> None:
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, self._hwm)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        monitor = sub.get_monitor_socket(MONITORED)
        sub.connect(self.source.endpoint)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while True:
                ready = dict(await poller.poll(self._poll_ms))
                if monitor in ready:
                    await self._monitor_event(await monitor.recv_multipart())
                if sub in ready:
                    await self._frame(await sub.recv_multipart())
                elif not ready and self.connected and self.source.replay:
                    # Quiet for a poll: the last batches may have been lost on the way, with
                    # nothing after them to show the gap; a replay that finds none is cheap.
                    await self._catch_up()
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)
            self._trust(False, "stopped")

    async def _monitor_event(self, frames: list[bytes]) -> None:
        event = parse_monitor_message(frames)["event"]
        if event == zmq.EVENT_CONNECTED:
            self.connected = True
            if self._ever_connected:
                self._drop("the publisher reconnected (its engine restarted)")
                self.order.restart()
            self._ever_connected = True
            await self._catch_up()
            self._trust(not self._broken, "connected")
        elif event == zmq.EVENT_DISCONNECTED:
            self.connected = False
            self._trust(False, "the publisher disconnected")

    async def _frame(self, frames: list[bytes]) -> None:
        try:
            batch = read_frame(frames)
        except WireError as exc:
            self._bad(str(exc))
            return
        step = self.order.live(batch.seq)
        if step is Step.RESTART:
            self._drop(f"batch {batch.seq} after {self.order.last}: the engine restarted")
            self.order.restart()
            step = self.order.live(batch.seq)
        if step is Step.GAP:
            await self._catch_up(batch.seq)
            step = self.order.live(batch.seq)
        if step is Step.APPLY:
            self._apply(batch)
        if self.connected and not self._broken:
            self._trust(True, "caught up")

    async def _catch_up(self, until: int | None = None) -> None:
        """Apply what the publisher still keeps from the first batch not applied on. What it
        no longer keeps (or anything, without a replay socket or an answer in time) is lost:
        the unit's entries are dropped and the stream goes on from the first batch there is
        (`until`: the live batch that showed the gap)."""
        if self.source.replay:
            await self._replay()
        if until is not None and self.order.want < until:
            self._drop(f"batches {self.order.want}..{until - 1} were lost")
            self.order.resume_at(until)

    async def _replay(self) -> None:
        self.replays += 1
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.source.replay)
        try:
            await dealer.send_multipart([b"", self.order.want.to_bytes(8, "big")])
            while True:
                if not await dealer.poll(self._replay_timeout_ms):
                    log.warning("unit %s: no replay from %s in time", self.unit, self.source.replay)
                    return
                frames = await dealer.recv_multipart()
                if len(frames) != 4:
                    raise WireError(f"a replayed message has 4 frames, not {len(frames)}")
                seq = seq_of(frames[2])
                if seq == END:
                    break
                batch = read_batch(seq, frames[3])
                step = self.order.replayed(seq)
                if step is Step.GAP:  # the publisher no longer keeps the batches before it
                    self._drop(f"batches {self.order.want}..{seq - 1} are no longer kept")
                    self.order.resume_at(seq)
                    step = Step.APPLY
                if step is Step.APPLY:
                    self._apply(batch)
                    self.replayed += 1
        except WireError as exc:
            self._bad(f"replay: {exc}")
            return
        finally:
            dealer.close(linger=0)
        self.order.replay_done()

    def _apply(self, batch: Batch) -> None:
        past = self._past_vocabulary(batch)
        if past is not None:
            self.foreign += 1
            self._broken = True
            self.order.applied(batch.seq)  # read, and refused: no gap to replay
            self._trust(False, f"events of another model: {past}")
            return
        self.index.apply(self.unit, batch)
        self.order.applied(batch.seq)
        self.batches += 1
        self._broken = False

    def _past_vocabulary(self, batch: Batch) -> str | None:
        vocabulary = self.vocabulary
        if vocabulary is None:
            return None
        for event in batch.events:
            if isinstance(event, Stored) and event.token_ids:
                top = max(event.token_ids)
                if top >= vocabulary:
                    return f"token id {top}, where its model's tokenizer has {vocabulary}"
        return None

    def _bad(self, why: str) -> None:
        self.garbage += 1
        self._broken = True
        self._trust(False, f"a bad frame: {why}")

    def _drop(self, why: str) -> None:
        self.dropped += 1
        self.index.drop(self.unit)
        log.info("unit %s: KV index entries dropped: %s", self.unit, why)

    def _trust(self, trusted: bool, why: str) -> None:
        if trusted != self.trusted:
            self.trusted = trusted
            self._on_trust(self.unit, trusted, why)
