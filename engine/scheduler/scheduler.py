"""Continuous batching over slot-based KV: pure bookkeeping, no torch, no I/O.

The engine loop calls `schedule()`, runs the model on the batch, samples one token per entry
and hands them to `update()`. `add()`, `abort()` and `preempt()` may be called between steps;
a token sampled for a sequence aborted or preempted meanwhile is dropped.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq

from engine.scheduler.batch import ScheduledBatch, ScheduledSeq
from engine.scheduler.config import SchedulerConfig
from engine.scheduler.errors import (
    DuplicateSequence,
    EmptyPrompt,
    PromptTooLong,
    UnknownSequence,
)
from engine.scheduler.sequence import FinishReason, SamplingParams, Sequence, SequenceStatus
from engine.scheduler.stops import find_stop


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        eos_token_ids: frozenset[int],
        decode: Callable[[Seq[int]], str],
    ) -> None:
        """`decode` is injected so stop strings work without a tokenizer dependency.

        It must be prefix-stable (decoding more tokens only appends text). Byte-level BPE is,
        except for a character split across tokens; text deltas hold that back.
        """
        self.config = config
        self._eos = eos_token_ids
        self._decode = decode
        self._waiting: deque[Sequence] = deque()
        self._running: dict[int, Sequence] = {}  # admission order = decode batch order
        self._live: dict[int, Sequence] = {}  # waiting or running, for O(1) lookups
        self._free: list[int] = list(range(config.num_slots))  # heap: lowest slot first

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

    def get(self, seq_id: int) -> Sequence | None:
        """The live (waiting or running) sequence with this id."""
        return self._live.get(seq_id)

    # -- requests in --

    def add(self, seq_id: int, prompt_ids: Seq[int], params: SamplingParams) -> Sequence:
        """Queue a request at the back; reject what could never run, before it waits."""
        limit = self.config.max_seq_len - 1  # leave room for at least one output token
        if not prompt_ids:
            raise EmptyPrompt(seq_id)
        if len(prompt_ids) > limit:
            raise PromptTooLong(seq_id, len(prompt_ids), limit)
        if self.get(seq_id) is not None:
            raise DuplicateSequence(seq_id)
        room = self.config.max_seq_len - len(prompt_ids)
        seq = Sequence(
            seq_id, tuple(prompt_ids), params, min(params.max_tokens, room), self._decode
        )
        self._waiting.append(seq)
        self._live[seq_id] = seq
        return seq

    def abort(self, seq_id: int) -> bool:
        """Drop a request wherever it is; False if it is unknown or already finished."""
        seq = self._live.get(seq_id)
        if seq is None:
            return False
        if self._running.pop(seq_id, None) is None:
            self._waiting.remove(seq)
        self._finish(seq, FinishReason.ABORT)
        return True

    def preempt(self, seq_id: int) -> Sequence:
        """Free a running sequence's slot; it goes first in line and is recomputed later.

        Recompute, not swap: the next prefill feeds prompt + outputs so far, so nothing but
        the token ids has to survive. Outputs, text and params are kept.
        """
        seq = self._running.pop(seq_id, None)
        if seq is None:
            raise UnknownSequence(seq_id, "running")
        self._release_slot(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self._waiting.appendleft(seq)
        return seq

    # -- one step --

    def schedule(self) -> ScheduledBatch:
        """Prefill newly admitted sequences if any, else decode one token for all running."""
        admitted = self._admit()
        if admitted:
            prefills = tuple(self._entry(s, start=0) for s in admitted)
            return ScheduledBatch(prefills, is_prefill=True, num_waiting=self.num_waiting)
        decodes = tuple(self._entry(s, start=s.num_tokens - 1) for s in self._running.values())
        return ScheduledBatch(decodes, is_prefill=False, num_waiting=self.num_waiting)

    def update(self, sampled: Mapping[int, int]) -> list[Sequence]:
        """Append each sampled token; return the sequences that finished (their slots are free)."""
        finished = []
        for seq_id, token in sampled.items():
            seq = self._running.get(seq_id)
            if seq is None:  # aborted or preempted while the step ran
                continue
            reason = self._append(seq, token)
            if reason is not None:
                del self._running[seq_id]
                self._finish(seq, reason)
                finished.append(seq)
        return finished

    # -- internals --

    def _admit(self) -> list[Sequence]:
        """FIFO without skipping: a big prompt at the head is never starved by small ones.

        A prompt over the token budget is admitted alone, when nothing else is in the batch.
        """
        admitted: list[Sequence] = []
        budget = self.config.max_num_batched_tokens
        while self._waiting and self._free and self.num_running < self.config.max_num_seqs:
            head = self._waiting[0]
            if admitted and head.num_tokens > budget:
                break
            self._waiting.popleft()
            head.slot = heapq.heappop(self._free)
            head.status = SequenceStatus.RUNNING
            self._running[head.seq_id] = head
            admitted.append(head)
            budget -= head.num_tokens
        return admitted

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
        self._release_slot(seq)
        del self._live[seq.seq_id]
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def _release_slot(self, seq: Sequence) -> None:
        if seq.slot is not None:
            heapq.heappush(self._free, seq.slot)
            seq.slot = None

    @staticmethod
    def _entry(seq: Sequence, start: int) -> ScheduledSeq:
        """Feed every token from `start` on: all of them for a prefill, the last for a decode."""
        assert seq.slot is not None, "a running sequence always owns a slot"
        return ScheduledSeq(seq.seq_id, seq.slot, seq.tokens_from(start), start, seq.params)
