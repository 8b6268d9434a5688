"""The KV event publisher: vLLM's ZmqEventPublisher (vllm/distributed/kv_events.py, vLLM 0.32),
its wire and its replay, so one subscriber reads a builtin unit and a stock vLLM unit alike.

- A PUB socket sends each batch as `[topic, seq, payload]`: `seq` numbers the batches 0, 1, 2,
  ... from the publisher's start, 8 bytes big-endian; `payload` is a msgpack KVEventBatch
  (wire.py: an array batch of map events with a "type" key, vLLM 0.32's encoding).
- A ROUTER socket (optional) replays: a client sends `[b"", start]` (8 bytes, big-endian) and
  gets `[b"", topic, seq, payload]` for each kept batch numbered `start` or later, then the
  end marker `[b"", b"", seq -1, b""]`. The last `buffer_steps` batches are kept.
- A background thread owns both sockets, encodes and sends; `publish()` only queues.

Two departures from vLLM, neither visible on the wire of a healthy stream:
- Both endpoints are bound, whatever their address (`tcp://127.0.0.1:5557`, `tcp://*:0` for
  a port the OS picks, `ipc://...`): this engine is the server its gateway connects to,
  never a client of a collector (vLLM binds only wildcard and IPC addresses).
- `publish()` never blocks the engine's step: with the queue full (the thread stalled), the
  batch is dropped and its number skipped, so a subscriber sees a gap that no replay can fill
  and drops the unit's entries (gateway/kvevents/order.py), where vLLM's would wait.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from types import TracebackType

import msgspec
import zmq

from engine.prefixcache.events import CacheEvent
from engine.prefixcache.wire import MEDIUM, batch

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)  # ends a replay

_Item = tuple[int, float, tuple[CacheEvent, ...]]


class KVEventPublisher:
    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        data_parallel_rank: int = 0,
        medium: str = MEDIUM,
        poll_interval: float = 0.05,
    ) -> None:
        """Binds now (a bad or busy address raises here, at start-up); `endpoint` and
        `replay_endpoint` then say where they are bound (the port the OS picked for port 0).
        Defaults as vLLM's KVEventsConfig. `poll_interval`: how long the idle thread waits
        for a batch before looking at the replay socket again (a replay's latency)."""
        _check("buffer_steps", buffer_steps, buffer_steps >= 0)
        _check("hwm", hwm, hwm >= 0)
        _check("max_queue_size", max_queue_size, max_queue_size >= 1)  # 0 would be unbounded
        _check("poll_interval", poll_interval, poll_interval > 0)
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self.endpoint = _bind(self._pub, endpoint)
            self.replay_endpoint: str | None = None
            if replay_endpoint is not None:
                self._replay = self._context.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self.replay_endpoint = _bind(self._replay, replay_endpoint)
        except zmq.ZMQError:
            self._close_sockets()
            self._context.term()
            raise
        self._topic = topic.encode()
        self._rank, self._medium = data_parallel_rank, medium
        self._poll_s = poll_interval
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._next_seq = 0
        self._closing = threading.Event()
        self.published = 0  # batches sent
        self.dropped = 0  # batches the full queue refused
        self.replays = 0  # replay requests answered
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: Sequence[CacheEvent], ts: float | None = None) -> int | None:
        """Queue one step's events as a batch; its sequence number, or None when there was
        nothing to send (no events, as vLLM skips empty steps) or the queue was full."""
        if self._closing.is_set():
            raise RuntimeError("the KV event publisher is closed")
        if not events:
            return None
        item_ts = time.time() if ts is None else ts
        try:
            with self._lock:  # numbered and queued in one order, whichever thread publishes
                seq = self._next_seq
                self._next_seq += 1
                self._queue.put_nowait((seq, item_ts, tuple(events)))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning(
                    "KV event batch %d dropped: the queue is full (%d so far)", seq, self.dropped
                )
            return None
        return seq

    def close(self, timeout: float = 1.0) -> None:
        """Send what is queued (for up to `timeout`), then close the sockets."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the KV event thread did not stop within %.1f s", timeout)
            return  # it closes its sockets when it ends; the context is left to it
        self._context.term()

    def __enter__(self) -> KVEventPublisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        try:
            while True:
                if self._replay is not None and self._replay.poll(0):
                    self._serve_replay(self._replay)
                try:
                    seq, ts, events = self._queue.get(timeout=self._poll_s)
                except queue.Empty:
                    if self._closing.is_set():
                        return
                    continue
                payload = encoder.encode(batch(events, ts, self._rank, self._medium))
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
                self._buffer.append((seq, payload))
                self.published += 1
        except Exception:
            log.exception("the KV event thread failed; no more events are published")
        finally:
            self._close_sockets()

    def _serve_replay(self, router: zmq.Socket[bytes]) -> None:
        frames = router.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("a KV event replay request of %d frames ignored", len(frames))
            return
        client, _, start_bytes = frames
        start = int.from_bytes(start_bytes, "big")
        for seq, payload in self._buffer:
            if seq >= start:
                router.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        self.replays += 1
        router.send_multipart((client, b"", b"", END_SEQ, b""))

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)


def _check(name: str, value: object, ok: bool) -> None:
    if not ok:
        raise ValueError(f"{name}: {value!r} is out of range")


def _bind(socket: zmq.Socket[bytes], endpoint: str) -> str:
    """Bind; where it is bound (`tcp://*:0`: the port the OS picked)."""
    socket.bind(endpoint)
    bound = socket.getsockopt(zmq.LAST_ENDPOINT)
    assert isinstance(bound, bytes)
    return bound.decode()
