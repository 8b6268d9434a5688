"""One request's state as the scheduler sees it: tokens, slot, status and visible text."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from engine.scheduler.detok import REPLACEMENT_CHAR, Decode, IncrementalText
from engine.scheduler.errors import InvalidParams
from engine.scheduler.stops import partial_stop_len

MAX_LOGPROBS = 20  # OpenAI's top_logprobs ceiling


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    """Values are the OpenAI `finish_reason` strings, so the server can pass them through."""

    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens (possibly clamped to the KV slot)
    ABORT = "abort"  # the client went away


def _check(ok: bool, name: str, value: object, problem: str) -> None:
    if not ok:
        raise InvalidParams(name, value, problem)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request knobs. Tuples, not lists, so a params object can be shared and hashed."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # OpenAI's penalties on the tokens generated so far: presence subtracts once per token
    # that occurred, frequency once per occurrence; both in [-2, 2].
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # vLLM's (and HF's) multiplicative penalty on every token of prompt and output: a
    # positive logit is divided by it, a negative one multiplied; 1 is off.
    repetition_penalty: float = 1.0
    # (token id, bias in [-100, 100]) pairs added to the logits, sorted by token id.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # None: no logprobs; k >= 0: the sampled token's logprob and the k most likely.
    logprobs: int | None = None
    # vLLM's field: lower is served sooner; equal priorities go in arrival order.
    priority: int = 0

    def __post_init__(self) -> None:
        _check(self.max_tokens >= 1, "max_tokens", self.max_tokens, "must be >= 1")
        ok_temp = math.isfinite(self.temperature) and self.temperature >= 0
        _check(ok_temp, "temperature", self.temperature, "must be a finite number >= 0")
        ok_top_p = math.isfinite(self.top_p) and 0 < self.top_p <= 1
        _check(ok_top_p, "top_p", self.top_p, "must be in (0, 1]")
        # A bare string would be iterated character by character: every letter a stop string.
        _check(isinstance(self.stop, tuple), "stop", self.stop, "must be a tuple of strings")
        ok_stop = all(isinstance(s, str) and s for s in self.stop)
        _check(ok_stop, "stop", self.stop, "every stop string must be non-empty")
        ok_ids = all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids)
        _check(ok_ids, "stop_token_ids", self.stop_token_ids, "must be token ids >= 0")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(math.isfinite(value) and -2 <= value <= 2, name, value, "must be in [-2, 2]")
        rp = self.repetition_penalty
        _check(math.isfinite(rp) and rp > 0, "repetition_penalty", rp, "must be a number > 0")
        ok_bias = all(
            isinstance(t, int) and t >= 0 and math.isfinite(b) and -100 <= b <= 100
            for t, b in self.logit_bias
        )
        _check(ok_bias, "logit_bias", self.logit_bias, "must map token ids to [-100, 100]")
        ok_lp = self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS
        _check(ok_lp, "logprobs", self.logprobs, f"must be in [0, {MAX_LOGPROBS}]")

    @property
    def penalized(self) -> bool:
        """Any penalty or bias to apply before sampling (the fast greedy path has none)."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1
            or self.logit_bias
        )


@dataclass(eq=False, slots=True)
class Sequence:
    """Mutable on purpose: the scheduler owns it and is its only writer.

    `prompt_ids` stays the client's prompt (usage accounting needs it); after a preemption the
    recompute prefill feeds `token_ids`, i.e. prompt + outputs so far.
    """

    seq_id: int
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    max_tokens: int  # params.max_tokens, clamped so prompt + output fits one KV slot
    decode: Decode = field(repr=False)  # the scheduler's tokenizer, for the visible text
    status: SequenceStatus = SequenceStatus.WAITING
    slot: int | None = None
    output_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None  # the EOS/stop token id or stop string that matched
    num_preemptions: int = 0
    # Leading tokens whose KV the slot holds once the step last scheduled has run: a prompt
    # longer than a step's budget is fed a chunk at a time. 0 while waiting.
    num_computed: int = 0
    # Leading prompt tokens the prefix cache held when the sequence was first admitted (the
    # answer's usage.prompt_tokens_details.cached_tokens, as vLLM reports); None until then.
    num_cached_tokens: int | None = None
    detok: IncrementalText = field(default_factory=IncrementalText, init=False, repr=False)
    _text: str = field(default="", init=False, repr=False)
    _shown: int = field(default=0, init=False, repr=False)  # output ids that make the text
    _decoded: int = field(default=0, init=False, repr=False)  # output ids `_text` is from
    _emitted: int = field(default=0, init=False, repr=False)

    @property
    def max_tokens_clamped(self) -> bool:
        return self.max_tokens < self.params.max_tokens

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.prompt_ids + tuple(self.output_ids)

    def tokens_from(self, start: int) -> tuple[int, ...]:
        """`token_ids[start:]` without building the whole tuple: a decode step needs one id."""
        cut = start - len(self.prompt_ids)
        if cut >= 0:
            return tuple(self.output_ids[cut:])
        return self.prompt_ids[start:] + tuple(self.output_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def visible_text(self) -> str:
        """Output text without EOS/stop tokens, cut before a matched stop string.

        While running, its tail may still become a stop string; stream with `take_text_delta`.
        """
        return self.text_now()

    def take_text_delta(self) -> str:
        """Text since the last call that can no longer change, so a stream never takes back.

        Holds back a tail that could be the start of a stop string, and a trailing replacement
        character (a multi-byte character split across tokens), until the sequence finishes.
        """
        text = self.text_now()
        end = len(text)
        if not self.is_finished:
            end -= partial_stop_len(text, self.params.stop)
            while end > self._emitted and text[end - 1] == REPLACEMENT_CHAR:
                end -= 1
        if end <= self._emitted:
            return ""
        delta, self._emitted = text[self._emitted : end], end
        return delta

    # -- the scheduler's side --

    def show_output(self) -> None:
        """Every output id so far belongs to the text (EOS and stop tokens never do). The
        text is decoded when first read, not here: the scheduler decodes eagerly only for
        sequences with stop strings, so the others' decoding happens off the step's critical
        path (the leader reads text after sending the next step message)."""
        self._shown = len(self.output_ids)

    def text_now(self) -> str:
        if self._decoded != self._shown:
            n = self._shown
            ids = self.output_ids if n == len(self.output_ids) else self.output_ids[:n]
            self._text = self.detok.update(ids, self.decode)
            self._decoded = n
        return self._text

    def cut_text(self, end: int) -> None:
        """A stop string starts at `end`: the text ends there. The sequence finishes, so no
        output is shown after this and the cut text is never decoded again."""
        self._text = self.text_now()[:end]
