"""Stop-string matching helpers."""

from __future__ import annotations

from engine.scheduler import find_stop, partial_stop_len


def test_find_stop_returns_the_earliest_match() -> None:
    assert find_stop("hello world", ("o w", "world")) == (4, "o w")
    assert find_stop("hello", ("xyz",)) is None
    assert find_stop("hello", ()) is None


def test_partial_stop_len_is_the_longest_growable_tail() -> None:
    assert partial_stop_len("abc", ("cde",)) == 1
    assert partial_stop_len("abcd", ("cde",)) == 2
    assert partial_stop_len("abcd", ("cde", "bcdz")) == 3
    assert partial_stop_len("abcx", ("cde",)) == 0
    assert partial_stop_len("c", ("cdef",)) == 1


def test_a_complete_stop_string_is_not_partial() -> None:
    # A full match is find_stop's business: only proper prefixes are held back.
    assert partial_stop_len("xab", ("ab",)) == 0
    assert partial_stop_len("xa", ("ab",)) == 1
