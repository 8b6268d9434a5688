"""Scheduler: how sequences finish (EOS, stop tokens, stop strings, length) and stream text."""

from __future__ import annotations

from collections.abc import Sequence as Seq

from engine.scheduler import FinishReason, SamplingParams, Scheduler, SchedulerConfig
from tests.engine.scheduler_support import EOS, make, step, tok


def test_eos_finishes_with_stop_and_is_not_visible() -> None:
    sched = make()
    seq = sched.add(0, [1], SamplingParams())
    step(sched, tok("h")[0])
    step(sched, tok("i")[0])
    sched.schedule()
    finished = sched.update({0: EOS})
    assert finished == [seq]
    assert seq.finish_reason is FinishReason.STOP
    assert seq.stop_reason == EOS
    assert seq.output_ids == [*tok("hi"), EOS]
    assert seq.visible_text() == "hi"
    assert seq.slot is None
    assert sched.free_slots == 8


def test_ignore_eos_keeps_generating() -> None:
    sched = make()
    seq = sched.add(0, [1], SamplingParams(max_tokens=3, ignore_eos=True))
    step(sched, EOS)
    step(sched, EOS)
    assert not seq.is_finished
    step(sched, EOS)
    assert seq.finish_reason is FinishReason.LENGTH


def test_stop_token_id_finishes_and_is_not_visible() -> None:
    sched = make()
    seq = sched.add(0, [1], SamplingParams(stop_token_ids=(25,)))
    step(sched, 0)
    step(sched, 25)
    assert seq.finish_reason is FinishReason.STOP
    assert seq.stop_reason == 25
    assert seq.visible_text() == "a"


def test_stop_string_spanning_two_tokens_cuts_the_text() -> None:
    sched = make()
    seq = sched.add(0, [1], SamplingParams(stop=("cd",)))
    for token in tok("abc"):
        step(sched, token)
    assert not seq.is_finished
    step(sched, tok("d")[0])
    assert seq.finish_reason is FinishReason.STOP
    assert seq.stop_reason == "cd"
    assert seq.visible_text() == "ab"
    assert sched.num_running == 0


def test_stop_string_inside_a_token_drops_the_rest_of_it() -> None:
    pieces = {0: "he", 1: "llo", 2: " wor", 3: "ld"}
    sched = Scheduler(
        SchedulerConfig(), frozenset({EOS}), lambda ids: "".join(pieces[i] for i in ids)
    )
    seq = sched.add(0, [1], SamplingParams(stop=("o w", "zzz")))
    for token in (0, 1, 2):
        step(sched, token)
    assert seq.finish_reason is FinishReason.STOP
    assert seq.visible_text() == "hell"


def test_earliest_stop_string_wins() -> None:
    sched = make()
    seq = sched.add(0, [1], SamplingParams(stop=("bcd", "cd")))
    for token in tok("abcd"):
        step(sched, token)
    assert seq.stop_reason == "bcd"
    assert seq.visible_text() == "a"


def test_deltas_hold_back_a_possible_stop_prefix() -> None:
    sched = make()
    seq = sched.add(0, [1], SamplingParams(stop=("cde",)))
    deltas = []
    for token in tok("abcdx"):
        step(sched, token)
        deltas.append(seq.take_text_delta())
    assert deltas == ["a", "b", "", "", "cdx"]
    assert "".join(deltas) == seq.visible_text() == "abcdx"


def test_deltas_never_emit_the_stop_string() -> None:
    sched = make()
    seq = sched.add(0, [1], SamplingParams(stop=("cde",)))
    deltas = []
    for token in tok("abcde"):
        step(sched, token)
        deltas.append(seq.take_text_delta())
    assert deltas == ["a", "b", "", "", ""]
    assert seq.finish_reason is FinishReason.STOP


def test_held_back_text_is_released_when_the_length_runs_out() -> None:
    sched = make()
    seq = sched.add(0, [1], SamplingParams(max_tokens=2, stop=("bc",)))
    step(sched, 0)
    assert seq.take_text_delta() == "a"
    step(sched, 1)
    assert seq.finish_reason is FinishReason.LENGTH
    assert seq.take_text_delta() == "b"
    assert seq.take_text_delta() == ""


def test_deltas_hold_back_a_split_character() -> None:
    pieces = {0: "a", 1: "\ufffd", 2: "é"}

    def decode(ids: Seq[int]) -> str:
        # Token 1 is the first byte of "é", token 2 the second: together they decode to "é".
        text = "".join(pieces[i] for i in ids)
        return text.replace("\ufffdé", "é")

    sched = Scheduler(SchedulerConfig(), frozenset({EOS}), decode)
    seq = sched.add(0, [1], SamplingParams())
    step(sched, 0)
    step(sched, 1)
    assert seq.take_text_delta() == "a"
    step(sched, 2)
    assert seq.take_text_delta() == "é"


def test_length_finishes_after_max_tokens() -> None:
    sched = make()
    seq = sched.add(0, [1], SamplingParams(max_tokens=3))
    step(sched, 0)
    step(sched, 1)
    assert not seq.is_finished
    batch = sched.schedule()
    assert sched.update({0: 2}) == [seq]
    assert batch.seq_ids == (0,)
    assert seq.finish_reason is FinishReason.LENGTH
    assert seq.visible_text() == "abc"
    assert not sched.has_work


def test_max_tokens_is_clamped_to_the_slot() -> None:
    sched = make(max_seq_len=10)
    long = sched.add(0, [1] * 7, SamplingParams(max_tokens=16))
    short = sched.add(1, [1] * 2, SamplingParams(max_tokens=8))
    assert (long.max_tokens, long.max_tokens_clamped) == (3, True)
    assert (short.max_tokens, short.max_tokens_clamped) == (8, False)
    for _ in range(3):
        step(sched, 0)
    assert long.finish_reason is FinishReason.LENGTH
    assert long.num_tokens == 10
    assert not short.is_finished
