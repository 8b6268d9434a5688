"""Continuous batching over a paged KV cache: pure bookkeeping, no torch, no I/O.

The engine loop calls `schedule()`, runs the model on the batch, samples one token per sampled
entry (a decode, or a prompt's last chunk; and per child sharing an entry's row, see
`ScheduledBatch`) and hands them to `update()`. A prompt is prefilled in chunks of the step's
token budget, beside the running sequences' decodes (chunked prefill).
`add()`, `add_group()`, `abort()` and `preempt()` may be called between steps; a token
sampled for a sequence aborted or preempted meanwhile (also by `schedule()`) is dropped.

A running sequence holds a slot (a row of the runners' block tables) and blocks of the
prefix cache's pool (engine.prefixcache): admission takes the blocks of the prompt's longest
cached prefix and prefills only after them; each step's `ScheduledBatch.tables` tells the
runners the table entries that changed. The pool holds at least every slot's whole sequence,
so a running sequence never runs out of blocks; what is left over keeps cached prefixes.

Requests wait in (priority, arrival) order (lower priority values first) and are admitted in
that order without skipping. At full batch, a head of strictly better priority than the worst
running sequence takes its place: that sequence is preempted (recomputed later). Ties never
preempt, so two sequences cannot preempt each other back and forth.
"""

from __future__ import annotations

import heapq
import itertools
import sys
from collections.abc import Callable, Container, Mapping
from collections.abc import Sequence as Seq

from engine.prefixcache import BlockCopy, EventSink, KVBlockPool, PrefixCacheStats, TableEdit
from engine.scheduler.awaiting import Awaiting, Pairs
from engine.scheduler.batch import ScheduledBatch, ScheduledSeq
from engine.scheduler.config import SchedulerConfig
from engine.scheduler.errors import (
    DuplicateSequence,
    EmptyPrompt,
    GroupTooLarge,
    InvalidParams,
    PromptTooLong,
    UnknownSequence,
)
from engine.scheduler.sequence import FinishReason, SamplingParams, Sequence, SequenceStatus
from engine.scheduler.stops import find_stop
from engine.scheduler.waiting import Members, WaitingQueue


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        eos_token_ids: frozenset[int],
        decode: Callable[[Seq[int]], str],
        on_event: EventSink | None = None,
    ) -> None:
        """`decode` is injected so stop strings work without a tokenizer dependency.

        It must be prefix-stable (decoding more tokens only appends text). Byte-level BPE is,
        except for a character split across tokens; text deltas hold that back.
        `on_event` hears the prefix cache's events (blocks stored and removed), in order.
        """
        self.config = config
        self._eos = eos_token_ids
        self._decode = decode
        self._arrival: dict[int, int] = {}  # live seq_id -> place in line, kept when preempted
        self._arrivals = itertools.count()
        self._waiting = WaitingQueue(self._arrival.__getitem__)
        self._running: dict[int, Sequence] = {}  # admission order = decode batch order
        self._live: dict[int, Sequence] = {}  # waiting or running, for O(1) lookups
        self._free: list[int] = list(range(config.num_slots))  # heap: lowest slot first
        # No running sequence has a worse (higher) priority than this: the worst admitted since
        # the running set was last empty. With one priority level in use, it is that level
        # and a full batch costs one comparison, no scan for sequences to preempt.
        self._worst_started = -sys.maxsize
        # A request's other choices, fed nothing until their parent's last prompt chunk.
        self._awaiting = Awaiting()
        self._pool = KVBlockPool(
            config.total_blocks,
            config.block_size,
            on_event=on_event,
            caching=config.prefix_caching,
        )
        self._synced: dict[int, int] = {}  # running seq_id -> table entries the runners have

    # -- introspection for health and metrics --

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def pending(self) -> int:
        return self.num_waiting + self.num_running

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def has_work(self) -> bool:
        return self.pending > 0

    @property
    def prefix_stats(self) -> PrefixCacheStats:
        return self._pool.stats

    @property
    def kv_usage(self) -> float:
        """The share of KV blocks running sequences hold (vLLM's kv_cache_usage_perc)."""
        return self._pool.usage

    def get(self, seq_id: int) -> Sequence | None:
        """The live (waiting or running) sequence with this id."""
        return self._live.get(seq_id)

    # -- requests in --

    def add(self, seq_id: int, prompt_ids: Seq[int], params: SamplingParams) -> Sequence:
        """Queue a request behind those of its priority; reject what could never run."""
        seq = self._new(seq_id, prompt_ids, params)
        self._waiting.append(params.priority, (seq,))
        return seq

    def add_group(
        self, seq_ids: Seq[int], prompt_ids: Seq[int], params: SamplingParams
    ) -> list[Sequence]:
        """Queue a request's n choices (OpenAI's `n`), one sequence each, sharing one prefill.

        They are admitted together or not at all, costing the token budget one prompt; the
        first prefills and the others copy its KV (`ScheduledBatch.forks`). From then on each
        is an ordinary sequence: preempted, it is recomputed alone; aborted, the others go on.
        """
        n = len(seq_ids)
        if n == 0:
            raise InvalidParams("n", n, "must be >= 1")
        self._check_prompt(seq_ids[0], prompt_ids)
        if n > self.config.num_slots:
            raise GroupTooLarge(seq_ids[0], n, self.config.num_slots, "KV slots")
        if n > self.config.max_num_seqs:
            what = "sequences running at once (max_num_seqs)"
            raise GroupTooLarge(seq_ids[0], n, self.config.max_num_seqs, what)
        seen: set[int] = set()
        for seq_id in seq_ids:  # all checked before any is registered
            if seq_id in self._live or seq_id in seen:
                raise DuplicateSequence(seq_id)
            seen.add(seq_id)
        members = tuple(self._new(seq_id, prompt_ids, params) for seq_id in seq_ids)
        self._waiting.append(params.priority, members)
        return list(members)

    def abort(self, seq_id: int) -> bool:
        """Drop a request wherever it is; False if it is unknown or already finished.

        One sequence only: the other choices of its request are the caller's to abort."""
        seq = self._live.get(seq_id)
        if seq is None:
            return False
        if seq_id in self._running:
            self._stop_running(seq)
        else:
            self._waiting.remove(seq)
        self._finish(seq, FinishReason.ABORT)
        return True

    def preempt(self, seq_id: int) -> Sequence:
        """Free a running sequence's slot; it goes back at the front of its priority and is
        recomputed later.

        Recompute, not swap: the next prefill feeds prompt + outputs so far, so nothing but
        the token ids has to survive. Outputs, text and params are kept.
        """
        seq = self._running.get(seq_id)
        if seq is None:
            raise UnknownSequence(seq_id, "running")
        self._stop_running(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self._waiting.put_back(seq)
        return seq

    # -- one step --

    def schedule(
        self, skip: Container[int] = frozenset(), singles_limit: int | None = None
    ) -> ScheduledBatch:
        """Every running sequence's next token, then prompt chunks within the token budget.

        Chunked prefill: a step feeds at most `max_num_batched_tokens` prompt tokens, so a
        longer prompt takes several steps and the running sequences decode in each of them.
        A sequence with one token left to feed (a decode, or a prompt's last token) rides
        along outside the budget; these single-token entries come first in `seqs`.

        A pipelined engine has several steps in flight: `skip` holds the sequences fed in
        one not yet updated (neither fed again nor preempted), and `singles_limit` caps the
        single-token entries of this one (the rest go in the next step, so the running
        sequences make two or more batches).
        """
        budget = self.config.max_num_batched_tokens
        fresh, new = self._admit_share(budget, skip)
        shares = {True: new, False: budget - new}  # admitted now, or before
        singles: list[ScheduledSeq] = []
        chunks: list[ScheduledSeq] = []
        for seq in self._running.values():
            left = seq.num_tokens - seq.num_computed
            if seq.seq_id in self._awaiting or seq.seq_id in skip:
                continue  # a choice waiting for its parent's prompt KV, or in flight
            if left <= 1:
                if singles_limit is None or len(singles) < singles_limit:
                    singles.append(self._feed(seq, 1))
                continue
            pool = seq.seq_id in fresh
            take = min(left, shares[pool])
            if take > 0:
                chunks.append(self._feed(seq, take))
                shares[pool] -= take
        rows = tuple(singles + chunks)
        if not self._awaiting:
            return ScheduledBatch(rows, self.num_waiting, tables=self._edits(rows))
        pairs, shared = self._awaiting.forks(rows, self._running)
        copies = self._fork(pairs)
        children = tuple(child for _, child in pairs)
        return ScheduledBatch(rows, self.num_waiting, copies, shared, self._edits(rows, children))

    def _edits(self, rows: Seq[ScheduledSeq], more: Seq[Sequence] = ()) -> tuple[TableEdit, ...]:
        """The table entries the runners lack for the sequences this step touches."""
        edits: list[TableEdit] = []
        pool, synced = self._pool, self._synced
        for seq_id, slot in [(r.seq_id, r.slot) for r in rows] + [(s.seq_id, s.slot) for s in more]:
            have, now = synced[seq_id], pool.table_len(seq_id)
            if now > have:
                assert slot is not None
                edits.append(TableEdit(slot, have, pool.table(seq_id, have)))
                synced[seq_id] = now
        return tuple(edits)

    def _fork(self, pairs: Pairs) -> tuple[BlockCopy, ...]:
        """Children share their parent's full prompt blocks and copy its partial last one."""
        copies: list[BlockCopy] = []
        for parent, child in pairs:
            copy = self._pool.fork(parent.seq_id, child.seq_id)
            self._synced[child.seq_id] = 0
            child.num_cached_tokens = parent.num_cached_tokens
            if copy is not None:
                copies.append(copy)
        return tuple(copies)

    def _admit_share(self, budget: int, skip: Container[int]) -> tuple[set[int], int]:
        """Admit what the budget allows: (the prompts admitted now, the tokens they get).

        The running prompts go first, in admission order, but while requests wait they keep
        at most half the budget: a short prompt that arrives behind a long one starts at the
        next step instead of after the long one's last chunk. What admission leaves unused
        goes to the running prompts, so no step feeds less than it could.
        """
        demand = self._prompt_demand(budget)
        keep = budget - budget // 2 if self._waiting else budget
        offered = budget - min(demand, keep)
        admitted, left = self._admit(offered, skip)
        if not admitted:
            return set(), 0
        # taken in queue order: the last is the worst
        self._worst_started = max(self._worst_started, admitted[-1][0].params.priority)
        return {members[0].seq_id for members in admitted}, offered - max(left, 0)

    def update(self, sampled: Mapping[int, int]) -> list[Sequence]:
        """Append each sampled token; return the sequences that finished (their slots are free)."""
        finished = []
        for seq_id, token in sampled.items():
            seq = self._running.get(seq_id)
            if seq is None or seq.num_computed < seq.num_tokens:
                continue  # aborted or preempted while the step ran, or still mid-prompt
            self._pool.append(seq_id, token)  # caches the blocks its tokens before it filled
            reason = self._append(seq, token)
            if reason is not None:
                self._stop_running(seq)
                self._finish(seq, reason)
                finished.append(seq)
        return finished

    # -- internals --

    def _check_prompt(self, seq_id: int, prompt_ids: Seq[int]) -> None:
        limit = self.config.max_seq_len - 1  # leave room for at least one output token
        if not prompt_ids:
            raise EmptyPrompt(seq_id)
        if len(prompt_ids) > limit:
            raise PromptTooLong(seq_id, len(prompt_ids), limit)

    def _new(self, seq_id: int, prompt_ids: Seq[int], params: SamplingParams) -> Sequence:
        """Check, create and register a sequence (not yet in line)."""
        room = self.config.max_seq_len - len(prompt_ids)
        if not prompt_ids or room < 1:
            self._check_prompt(seq_id, prompt_ids)  # raises the precise error
        if seq_id in self._live:
            raise DuplicateSequence(seq_id)
        seq = Sequence(
            seq_id, tuple(prompt_ids), params, min(params.max_tokens, room), self._decode
        )
        self._live[seq_id] = seq
        self._arrival[seq_id] = next(self._arrivals)
        return seq

    def _prompt_demand(self, budget: int) -> int:
        """What the running prompts take of this step's budget."""
        demand = 0
        for seq in self._running.values():
            left = seq.num_tokens - seq.num_computed
            if left > 1 and seq.seq_id not in self._awaiting:
                demand += left
                if demand >= budget:
                    return budget
        return demand

    def _admit(self, budget: int, skip: Container[int]) -> tuple[list[Members], int]:
        """Queue order without skipping: a big prompt at the head is never starved by small
        ones, nor a group by single sequences.

        Admission goes on while `budget` lasts (what is left of it is returned); the last
        prompt admitted may get a chunk of it only. A group costs one prompt (one prefill). A
        sequence preempted here to make room waits at least until the next call, so a token
        sampled for it in flight is dropped.
        """
        admitted: list[Members] = []
        evicted: tuple[Sequence, ...] = ()
        waiting, running, free = self._waiting, self._running, self._free
        max_seqs = self.config.max_num_seqs
        while budget > 0 and (members := waiting.head()) is not None:
            n = len(members)
            full = len(free) < n or len(running) + n > max_seqs
            if full and members[0].params.priority >= self._worst_started:
                break  # nothing worse is running: the usual full batch, no scan
            if full:
                room = min(len(free), max_seqs - len(running))
                victims = self._make_room(members, room, skip)
                if victims is None:
                    break
                evicted += victims
            if evicted and any(m is members[0] for m in evicted):
                break
            waiting.pop()
            for seq in members:
                seq.slot = heapq.heappop(free)
                seq.status = SequenceStatus.RUNNING
                running[seq.seq_id] = seq
            self._awaiting.add(members)
            admitted.append(members)
            self._allocate(members[0])
            cost = members[0].num_tokens - members[0].num_computed
            budget -= cost if cost > 1 else 0  # a single token rides along, as a decode
        return admitted, budget

    def _make_room(
        self, members: Members, room: int, skip: Container[int]
    ) -> tuple[Sequence, ...] | None:
        """Preempt running sequences of strictly worse priority, the worst and latest-arrived
        first, until `members` fit; preempt none (None) unless that is enough. A sequence in
        flight (`skip`) is not preempted: its token is still to come."""
        priority = members[0].params.priority
        worse = [
            s
            for s in self._running.values()
            if s.params.priority > priority and s.seq_id not in skip
        ]
        need = len(members) - room
        if len(worse) < need:
            return None
        arrival = self._arrival
        worse.sort(key=lambda s: (s.params.priority, arrival[s.seq_id]), reverse=True)
        return tuple(self.preempt(seq.seq_id) for seq in worse[:need])

    def _allocate(self, seq: Sequence) -> None:
        """Blocks for a sequence that starts running (or prefills again): its prompt's cached
        prefix is taken, not computed. The pool always has room (see SchedulerConfig)."""
        allocation = self._pool.allocate(
            seq.seq_id, seq.token_ids, preempted=seq.num_preemptions > 0
        )
        seq.num_computed = allocation.cached_tokens
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = allocation.cached_tokens
        self._synced[seq.seq_id] = 0

    def _stop_running(self, seq: Sequence) -> None:
        """Out of the running set, its slot back on the free heap and its blocks to the
        pool (cached, for the next prompt that shares them)."""
        del self._running[seq.seq_id]
        assert seq.slot is not None, "a running sequence always owns a slot"
        heapq.heappush(self._free, seq.slot)
        seq.slot = None
        seq.num_computed = 0
        if self._synced.pop(seq.seq_id, None) is not None:
            self._pool.free(seq.seq_id)  # a child still awaiting its parent holds none
        if self._awaiting:
            heir = self._awaiting.drop(seq, self._running)
            if heir is not None:
                self._allocate(heir)
        if not self._running:
            self._worst_started = -sys.maxsize

    def _feed(self, seq: Sequence, n: int) -> ScheduledSeq:
        """The entry that feeds `n` more of the sequence's tokens; they count as computed."""
        assert seq.slot is not None, "a running sequence always owns a slot"
        # A sequence whose last token never came (no update for it) feeds its last again.
        start = min(seq.num_computed, seq.num_tokens - 1)
        ids = seq.tokens_from(start)
        seq.num_computed = start + n
        if n > 1:  # a prompt chunk: its full blocks are cached from now on (as vLLM does)
            self._pool.computed(seq.seq_id, seq.num_computed)
        last = seq.num_computed == seq.num_tokens
        return ScheduledSeq(seq.seq_id, seq.slot, ids if last else ids[:n], start, seq.params, last)

    def _append(self, seq: Sequence, token: int) -> FinishReason | None:
        """Checks run in order EOS, stop token, stop string, length; the first hit wins.

        EOS and stop tokens are not decoded into the visible text.
        """
        seq.output_ids.append(token)
        if token in self._eos and not seq.params.ignore_eos:
            seq.stop_reason = token
            return FinishReason.STOP
        if token in seq.params.stop_token_ids:
            seq.stop_reason = token
            return FinishReason.STOP
        seq.show_output()
        stops = seq.params.stop
        if stops:  # only these need the text now; the others decode when it is read
            # Text before this point was searched at earlier tokens and cannot change.
            start = seq.detok.stable_len - max(map(len, stops)) + 1
            match = find_stop(seq.text_now(), stops, max(0, start))
            if match is not None:
                seq.cut_text(match[0])
                seq.stop_reason = match[1]
                return FinishReason.STOP
        if len(seq.output_ids) >= seq.max_tokens:
            return FinishReason.LENGTH
        return None

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        """For a sequence already out of the waiting line or the running set."""
        del self._live[seq.seq_id]
        del self._arrival[seq.seq_id]
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
