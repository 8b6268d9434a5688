"""Incremental detokenization and the stop-string search it narrows: after every token, the
scheduler's text must be exactly what re-decoding all the output (the old way) gives."""

from __future__ import annotations

from collections.abc import Sequence as Seq

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model import ByteTokenizer
from engine.scheduler import FinishReason, SamplingParams, Scheduler, SchedulerConfig, find_stop
from engine.scheduler.detok import IncrementalText

BYTES = ByteTokenizer()
# Bytes that make multi-byte UTF-8 (leads, continuations), invalid bytes, ASCII, and specials.
TOKENS = st.one_of(
    st.sampled_from([0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80, 0xFF, 0x80]),
    st.integers(0x20, 0x7E),
    st.sampled_from(sorted(BYTES.stop_ids | {256, 260})),
)


def pieces(ids: Seq[int]) -> str:
    """A sentencepiece-like decoder: a token may carry a leading space, dropped at the very
    start of a text, so a token decodes differently with and without left context."""
    text = "".join(f" w{i}" if i % 3 == 0 else f"x{i}" for i in ids)
    return text.removeprefix(" ")


@settings(max_examples=300, deadline=None)
@given(st.lists(TOKENS, max_size=40))
def test_byte_text_matches_a_full_decode_after_every_token(ids: list[int]) -> None:
    inc = IncrementalText()
    for n in range(1, len(ids) + 1):
        assert inc.update(ids[:n], BYTES.decode) == BYTES.decode(ids[:n])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=30))
def test_left_context_sensitive_decoders_match_too(ids: list[int]) -> None:
    inc = IncrementalText()
    for n in range(1, len(ids) + 1):
        assert inc.update(ids[:n], pieces) == pieces(ids[:n])


def test_a_decoder_that_rewrites_its_left_context_falls_back_to_a_full_decode() -> None:
    def merging(ids: Seq[int]) -> str:  # "ab" renders as "X" whatever came before
        return "".join(chr(ord("a") + i) for i in ids).replace("ab", "X")

    inc = IncrementalText()
    for n, want in enumerate(["a", "X", "Xa", "XX"], start=1):
        assert inc.update([0, 1, 0, 1][:n], merging) == want


def test_the_window_stays_small_however_long_the_output() -> None:
    lengths: list[int] = []

    def decode(ids: Seq[int]) -> str:
        lengths.append(len(ids))
        return BYTES.decode(ids)

    inc = IncrementalText()
    ids = list(b"hello world, " * 100)
    text = ""
    for n in range(1, len(ids) + 1):
        text = inc.update(ids[:n], decode)
    assert text == BYTES.decode(ids)
    assert max(lengths) <= 2


# The bytes of "a", "b", " ", "é" and "€": stop strings over those letters match often.
STOP_TOKENS = st.sampled_from(list(b"ab " + "\u00e9\u20ac".encode()))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(STOP_TOKENS, min_size=1, max_size=40),
    st.lists(st.text("ab \u00e9\u20ac", min_size=1, max_size=3), min_size=1, max_size=3),
)
def test_stop_strings_cut_where_a_full_search_would(ids: list[int], stops: list[str]) -> None:
    """The scheduler searches only text that could hold a new match; the result must equal
    the earliest match in the whole re-decoded output."""
    sched = Scheduler(SchedulerConfig(), frozenset(), BYTES.decode)
    params = SamplingParams(max_tokens=len(ids), stop=tuple(stops))
    seq = sched.add(0, [65], params)
    for n, token in enumerate(ids, start=1):
        sched.schedule()
        sched.update({0: token})
        full = BYTES.decode(ids[:n])
        match = find_stop(full, stops)
        if match is not None:
            assert seq.finish_reason is FinishReason.STOP
            assert (seq.visible_text(), seq.stop_reason) == (full[: match[0]], match[1])
            return
        assert seq.visible_text() == full
    assert seq.finish_reason is FinishReason.LENGTH


def test_a_decode_step_feeds_only_the_last_token() -> None:
    sched = Scheduler(SchedulerConfig(), frozenset(), BYTES.decode)
    seq = sched.add(0, list(range(1, 17)), SamplingParams(max_tokens=10))
    assert sched.schedule().seqs[0].token_ids == tuple(range(1, 17))
    sched.update({0: 70})
    decode = sched.schedule().seqs[0]
    assert (decode.token_ids, decode.start_pos) == ((70,), 16)
    assert seq.tokens_from(15) == (16, 70)
    assert seq.tokens_from(0) == seq.token_ids


def test_without_stop_strings_text_is_decoded_only_when_read() -> None:
    """The leader reads text after sending the next step message; the scheduler's update,
    which runs before that send, must not decode for sequences without stop strings."""
    calls: list[int] = []

    def decode(ids: Seq[int]) -> str:
        calls.append(len(ids))
        return BYTES.decode(ids)

    sched = Scheduler(SchedulerConfig(), BYTES.stop_ids, decode)
    plain = sched.add(0, [65], SamplingParams(max_tokens=50))
    stopping = sched.add(1, [65], SamplingParams(max_tokens=50, stop=("zz",)))
    for token in b"hello":
        sched.schedule()
        calls.clear()
        sched.update({0: token, 1: token})
        assert calls and len(calls) == 2  # the stop-string sequence's window, twice
    assert plain.visible_text() == "hello" == stopping.visible_text()
    eos = min(BYTES.stop_ids)
    sched.schedule()
    sched.update({0: eos, 1: ord("!")})
    assert plain.take_text_delta() == "hello" and plain.visible_text() == "hello"
    assert stopping.take_text_delta() == "hello!"
