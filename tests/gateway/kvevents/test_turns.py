"""A conversation's earlier turns, kept by their messages and found by the next turn's."""

from __future__ import annotations

from array import array

from hypothesis import given
from hypothesis import strategies as st

from gateway.kvevents.turns import Turns, digest, keys

SYSTEM = {"role": "system", "content": "You sell tents."}
ASK = {"role": "user", "content": "A tent for two?"}
ANSWER = {"role": "assistant", "content": "The Ridge 2."}
MORE = {"role": "user", "content": "And for four?"}


def test_the_next_turn_finds_the_key_its_earlier_turn_was_kept_under() -> None:
    first, none = keys([SYSTEM, ASK])
    assert none is None  # a first turn continues nothing
    second, earlier = keys([SYSTEM, ASK, ANSWER, MORE])
    assert earlier == first and second != first
    # a tool's result after the assistant's call continues it too
    call = {"role": "assistant", "tool_calls": [{"id": "t1", "type": "function"}]}
    result = {"role": "tool", "tool_call_id": "t1", "content": "42"}
    assert keys([SYSTEM, ASK, call, result])[1] == first
    # the message before the last is not the assistant's: not a next turn
    assert keys([SYSTEM, ASK, MORE, MORE])[1] is None
    assert keys("not a list") == (None, None) and keys([]) == (None, None)


@given(
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": st.text()}
        ),
        min_size=1,
        max_size=6,
    )
)
def test_the_keys_are_the_digests_of_the_messages_and_of_all_but_the_last_two(
    messages: list[dict[str, str]],
) -> None:
    """`keys` serialises each message once; what it hashes is what `digest` does."""
    kept, earlier = keys(messages)
    assert kept == digest(messages)
    continues = len(messages) >= 3 and messages[-2]["role"] == "assistant"
    assert earlier == (digest(messages[:-2]) if continues else None)


def test_the_order_of_a_messages_members_does_not_matter() -> None:
    swapped = {"content": "You sell tents.", "role": "system"}
    assert digest([SYSTEM, ASK]) == digest([swapped, ASK])
    assert digest([SYSTEM, ASK]) != digest([ASK, SYSTEM])


def test_kept_tokens_are_bounded_the_least_recently_used_out_first() -> None:
    turns = Turns(capacity=10)
    turns.put(b"a", array("I", range(4)))
    turns.put(b"b", array("I", range(4)))
    assert turns.get(b"a") is not None  # a is now the most recently used
    turns.put(b"c", array("I", range(4)))  # 12 > 10: b goes
    assert turns.get(b"b") is None and turns.get(b"c") is not None
    assert turns.tokens == 8 and len(turns) == 2
    turns.put(b"a", array("I", range(6)))  # kept again, larger: 10 fit
    assert turns.tokens == 10 and turns.get(b"c") is not None
    turns.put(b"a", array("I", range(7)))  # 11: the least recently used (c) goes
    assert turns.tokens == 7 and turns.get(b"c") is None
    turns.put(b"huge", array("I", range(11)))  # larger than the store: not kept
    assert turns.get(b"huge") is None and turns.tokens == 7
    assert (turns.hits, turns.misses) == (3, 3)
