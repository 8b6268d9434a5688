"""The leader's engine: scheduling, the step broadcast, its own shard's forward, sampling.

torch compute and Gloo collectives block, so the engine loop runs on a dedicated thread and
talks to the asyncio side through two one-way channels: a thread-safe inbox (requests, aborts,
stop) and per-request asyncio.Queues fed with `loop.call_soon_threadsafe`. The HTTP server's
event loop therefore never waits on the model.

A failed collective (a follower died, or Gloo's timeout passed) poisons the whole unit: the
group cannot be repaired in place, so the engine marks itself unhealthy, ends every in-flight
request with an error event, refuses new ones, and leaves the restart to a supervisor.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import torch

from engine.api import STARTED, GenerationRequest, TokenEvent, TokenOutOfVocab
from engine.model import Tokenizer
from engine.prefixcache import CacheEvent
from engine.runtime.choices import Abort, Choice, Tracked, draw, final_event, token_event
from engine.runtime.constraints import Constraints
from engine.runtime.group import first_line
from engine.runtime.health import NodeStats
from engine.runtime.messages import Command, Send, StepMessage, send
from engine.runtime.outbox import Outbox
from engine.runtime.stepper import StepModel
from engine.sampling import Sampled, make_generator
from engine.scheduler import (
    DEFAULT_PREFILL_CHUNK,
    InvalidParams,
    ScheduledBatch,
    Scheduler,
    SchedulerConfig,
)

log = logging.getLogger(__name__)


_STOP = object()


class LeaderEngine:
    """engine.api.Engine for a unit of one leader (rank 0) and world_size - 1 followers."""

    def __init__(
        self,
        model: StepModel,
        tokenizer: Tokenizer,
        *,
        model_name: str,
        unit: str = "",
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        heartbeat_s: float = 2.5,
        teardown: Callable[[], None] | None = None,
        send_step: Send = send,
        on_step: Callable[[int, int], None] | None = None,
        prefix_caching: bool = True,
        publish_events: Callable[[Sequence[CacheEvent]], object] | None = None,
    ) -> None:
        """`prefill_chunk`: prompt tokens one step feeds at most (chunked prefill: a longer
        prompt takes several steps, with the running sequences decoding in each).
        `heartbeat_s` must stay well under the collective timeout: an idle leader sends a
        HEARTBEAT that often so followers blocked in a broadcast do not time out.
        `send_step` is the broadcast every step message goes through, and `on_step` hears
        each step's (start, end) in monotonic ns on the engine thread: a benchmark times the
        engine through these two, without reaching into it.
        `prefix_caching`: reuse cached prompt prefixes (the KV blocks stay paged either way);
        `publish_events` gets the prefix cache's events of each step, as one batch, on the
        engine thread (a `KVEventPublisher.publish`: it only queues)."""
        slots, cache = model.cache.num_slots, model.cache
        self._config = SchedulerConfig(
            max_num_seqs=slots,
            max_num_batched_tokens=prefill_chunk,
            num_slots=slots,
            max_seq_len=model.config.max_seq_len,
            block_size=cache.block_size,
            num_blocks=cache.num_blocks,
            prefix_caching=prefix_caching,
        )
        self._events: list[CacheEvent] = []  # engine thread only: since the last publish
        self._publish_events = publish_events
        on_event = None if publish_events is None else self._events.append
        self.scheduler = Scheduler(self._config, tokenizer.stop_ids, tokenizer.decode, on_event)
        self.stats = NodeStats(
            "leader", unit, model.tp.rank, slots, tied=True, progress=lambda: model.layers_run
        )
        self._model, self._tokenizer, self._name = model, tokenizer, model_name
        self._heartbeat_s, self._teardown, self._send = heartbeat_s, teardown, send_step
        self._on_step = on_step
        self._inbox: queue.Queue[object] = queue.Queue()
        self._gate = threading.Lock()  # orders "stop accepting" against "accept"
        self._refusal: str | None = None  # why new requests are refused; engine thread writes
        self._ids = itertools.count()
        self._live: dict[int, Choice] = {}  # engine thread only, by seq_id
        # The sequences of requests that asked to hear when they start (announce_start) and
        # have not yet; engine thread only.
        self._unstarted: dict[int, Tracked] = {}
        self._by_name: dict[str, Tracked] = {}  # engine thread only
        self._outbox: Outbox[TokenEvent] = Outbox()  # engine thread only
        self._unpublished: dict[int, Sampled] | None = None  # the last step's tokens
        self._constraints = Constraints(tokenizer, model.config.vocab_size)
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    # -- engine.api.Engine --

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def max_seq_len(self) -> int:
        return self._config.max_seq_len

    def health(self) -> dict[str, Any]:
        return self.stats.snapshot()

    def check_grammar(self, grammar: str) -> None:
        self._constraints.check(grammar)

    def abort(self, request_id: str) -> None:
        self._inbox.put(Abort(request_id))

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        self._validate(request)
        sink: asyncio.Queue[TokenEvent] = asyncio.Queue()
        with self._gate:
            refusal = self._refusal
            if refusal is None:
                self._inbox.put(Tracked(request, sink, asyncio.get_running_loop()))
        if refusal is not None:
            yield final_event(request, None, "error", refusal)
            return
        open_choices = request.n
        try:
            while open_choices:
                event = await sink.get()
                if event.finished:  # an error or refusal ends the request at once
                    open_choices = 0 if event.error is not None else open_choices - 1
                yield event
        finally:
            if open_choices:  # the consumer stopped early (client gone, task cancelled)
                self.abort(request.request_id)

    # -- lifecycle --

    def start(self) -> LeaderEngine:
        self._thread.start()
        self._constraints.warm()
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        """End in-flight requests, broadcast STOP so followers exit 0, join, tear down."""
        if self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join(timeout)
        self._constraints.shutdown()
        if self._teardown is not None:
            self._teardown()

    def _validate(self, request: GenerationRequest) -> None:
        """Refuse here, in the caller's task, what the model would reject inside a step."""
        ids, vocab = request.prompt_ids, self._model.config.vocab_size
        if not ids:
            raise ValueError("prompt_ids: must hold at least one token")
        if len(ids) > self.max_seq_len - 1:
            raise ValueError(f"prompt_ids: {len(ids)} tokens, at most {self.max_seq_len - 1} fit")
        for token in (min(ids), max(ids)):
            if not 0 <= token < vocab:
                raise TokenOutOfVocab(token, vocab)
        n, slots = request.n, self._config.num_slots
        if not 1 <= n <= slots:
            raise InvalidParams("n", n, f"needs {n} KV slots at once; this unit has {slots}")
        if request.grammar is not None and request.params.ignore_eos:
            problem = "cannot be true with a constrained answer (it ends at the grammar's end)"
            raise InvalidParams("ignore_eos", True, problem)

    # -- the engine thread --

    def _run(self) -> None:
        try:
            while self._drain_inbox(block=not self.scheduler.has_work):
                if not self.scheduler.has_work:
                    continue
                if self._on_step is None:
                    self._step()
                else:
                    start = time.monotonic_ns()
                    self._step()
                    self._on_step(start, time.monotonic_ns())
            self._settle()
            with self._gate:
                self._refusal = "engine shut down"
                self._close(self._refusal)
            if self._distributed:
                self._send(StepMessage(Command.STOP), self._model.tp.group)
        except Exception as exc:
            self._fail(first_line(exc))

    def _settle(self) -> None:
        """Before the engine closes: finish what is in flight (see `PipelinedLeader`)."""

    @property
    def _distributed(self) -> bool:
        return self._model.tp.world_size > 1

    def _drain_inbox(self, block: bool) -> bool:
        """Apply queued commands; when idle, wait for one (heartbeating meanwhile).
        False once STOP arrives."""
        if block:
            self._publish()  # nothing more to run: hand everything over before waiting
        while True:
            try:
                item = self._inbox.get(block=block, timeout=self._heartbeat_s if block else None)
            except queue.Empty:
                if not block:
                    return True
                self._heartbeat()
                continue
            if item is _STOP:
                return False
            self._apply(item)
            block = False

    def _heartbeat(self) -> None:
        if self._distributed:
            self._send(StepMessage(Command.HEARTBEAT, pending=0), self._model.tp.group)

    def _apply(self, item: object) -> None:
        self._collect_tokens()  # the last step's finished requests are forgotten first
        if isinstance(item, Abort):
            live = self._by_name.get(item.request_id)
            for member in list(live.members or ()) if live is not None else ():
                if self.scheduler.abort(member.seq.seq_id):
                    self._emit_finished(member, "abort")
        elif isinstance(item, Tracked):
            self._admit(item)
        self.stats.set_load(self.scheduler.pending, self._slots_used)

    def _admit(self, item: Tracked) -> None:
        request = item.request
        if request.request_id in self._by_name:
            self._deliver(
                item, final_event(request, None, "error", "request_id is already running")
            )
            return
        ids = [next(self._ids) for _ in range(request.n)]
        try:  # matchers first: a grammar that fails must not leave sequences queued
            matchers = [self._constraints.matcher(request.grammar) for _ in ids]
            if request.n == 1:
                seqs = [self.scheduler.add(ids[0], request.prompt_ids, request.params)]
            else:
                seqs = self.scheduler.add_group(ids, request.prompt_ids, request.params)
        except ValueError as exc:
            self._deliver(item, final_event(request, None, "error", str(exc)))
            return
        item.members = [
            Choice(item, i, seq, make_generator(request.params, i), matcher)
            for i, (seq, matcher) in enumerate(zip(seqs, matchers, strict=True))
        ]
        item.open = len(item.members)
        for member in item.members:
            self._live[member.seq.seq_id] = member
            if request.announce_start:
                self._unstarted[member.seq.seq_id] = item
        self._by_name[request.request_id] = item

    def _announce(self, batch: ScheduledBatch) -> None:
        """Tell each request that asked and whose prompt this step first feeds that it has
        started: the event goes out with the last step's tokens, as the forward begins."""
        if not self._unstarted:
            return
        for s in batch.seqs:
            item = self._unstarted.pop(s.seq_id, None)
            if item is not None:  # its first choice fed: the others are not announced again
                for member in item.members or ():
                    self._unstarted.pop(member.seq.seq_id, None)
                self._outbox.put(item.loop, item.sink.put_nowait, STARTED)

    @property
    def _slots_used(self) -> int:
        return self._config.num_slots - self.scheduler.free_slots

    def _step(self) -> None:
        batch = self.scheduler.schedule()
        if batch.is_empty:
            self._publish()
            return
        entries = [(s.slot, s.token_ids, s.start_pos) for s in batch.seqs]
        if self._distributed:
            pending, used = self.scheduler.pending, self._slots_used
            msg = StepMessage.step(entries, pending, used, batch.forks, batch.tables)
            self._send(msg, self._model.tp.group)
        members = [self._live[seq_id] for seq_id in batch.sampled_ids]
        masks = self._constraints.start_masks([m.matcher for m in members])
        self._announce(batch)
        # The last step's tokens go out now, while the followers receive this step's message:
        # between the forward and the send they would delay the whole unit (see Outbox).
        self._publish()
        with self._model.cache.stepping(batch.tables, batch.forks):  # as every follower
            logits = self._model(entries)
        sampled = self._sample(batch, logits, members, masks)
        self.scheduler.update({seq_id: s.token for seq_id, s in sampled.items()})
        self._unpublished = sampled  # counted in /health once published, even if empty

    def _sample(
        self,
        batch: ScheduledBatch,
        logits: torch.Tensor,
        members: list[Choice],
        masks: Future[torch.Tensor] | None,
    ) -> dict[int, Sampled]:
        """A token per member; none when the step only fed prompt chunks not their last."""
        if not members:
            return {}
        if not batch.all_rows_sampled:  # skip partial chunks; a copy of a parent's row per
            logits = logits[list(batch.sample_rows)]  # child (sampling edits rows)
        bitmask = None if masks is None else masks.result()
        with torch.inference_mode():  # the logits are inference tensors, edited in place
            return draw(logits, members, bitmask, self._end)

    def _end(self, member: Choice, error: str) -> None:
        """Finish one choice with an error event (its request fails: a partial answer of
        choices is not one the client asked for)."""
        if self.scheduler.abort(member.seq.seq_id):
            self._emit_finished(member, "error", error)

    def _publish(self) -> None:
        self._collect_tokens()
        self._outbox.flush()
        if self._events:
            assert self._publish_events is not None
            self._publish_events(tuple(self._events))
            self._events.clear()  # the scheduler's sink appends to this very list

    def _collect_tokens(self) -> None:
        """Queue the last step's token events. Runs before the next scheduler update (the
        events read each sequence's text and state as that step left them) and before any
        other event is queued, so a request's events stay in order."""
        if self._unpublished is None:
            return
        sampled = self._unpublished
        self._unpublished = None
        self.stats.record_step(self.scheduler.pending, self._slots_used)
        self.stats.set_cache(self.scheduler.prefix_stats, self.scheduler.kv_usage)
        for seq_id, drawn in sampled.items():
            member = self._live.get(seq_id)
            if member is None:
                continue
            item = member.item
            self._outbox.put(item.loop, item.sink.put_nowait, token_event(member, drawn))
            if member.seq.is_finished:
                self._forget(member)

    def _emit_finished(self, member: Choice, reason: str, error: str | None = None) -> None:
        event = final_event(member.item.request, len(member.seq.output_ids), reason, error)
        self._deliver(member.item, replace(event, index=member.index))
        self._forget(member)

    def _forget(self, member: Choice) -> None:
        """A choice has had its final event; the request is forgotten with its last choice."""
        if self._live.pop(member.seq.seq_id, None) is None:
            return
        self._unstarted.pop(member.seq.seq_id, None)
        item = member.item
        item.open -= 1
        if item.open == 0:
            self._by_name.pop(item.request.request_id, None)

    def _close(self, error: str) -> None:
        """End every in-flight request with an error event, including ones still queued."""
        self._collect_tokens()
        for member in list(self._live.values()):
            self.scheduler.abort(member.seq.seq_id)
            self._emit_finished(member, "error", error)
        while True:
            try:
                pending = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(pending, Tracked):
                self._deliver(pending, final_event(pending.request, None, "error", error))
        self._outbox.flush()

    def _fail(self, reason: str) -> None:
        with self._gate:
            if self.stats.mark_unhealthy(reason):
                log.error("leader: unit failed (%s); failing in-flight requests", reason)
            self._refusal = f"engine unhealthy: {reason}"
            self._close(self._refusal)
        self.stats.set_load(0, 0)

    def _deliver(self, item: Tracked, event: TokenEvent) -> None:
        """Queued behind the last step's tokens; the loop flushes before it next waits or
        runs a forward."""
        self._collect_tokens()
        self._outbox.put(item.loop, item.sink.put_nowait, event)
