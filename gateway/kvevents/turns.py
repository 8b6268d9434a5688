"""A conversation's earlier turns, for routing its next turn where the gateway has no
tokenizer for the model: the prompt ids the unit reported for each turn, kept by the turn's
messages, found again by the next turn's.

A chat's next turn repeats the conversation so far and adds to it: turn n+1's messages are
turn n's, then the assistant's answer, then the new message (a user's, or a tool's result).
With a chat template that renders a conversation's start the same whatever follows it (the
templates of the models served here do), turn n's prompt ids are where turn n+1's begin; the
unit that computed them holds them in its prefix cache. So each resumable stream's prompt ids
(which the unit reports, `prompt_token_ids`) are kept under a digest of its messages, and a
request whose messages but the last two (an assistant's message, then the new one) digest to
a kept key starts with those ids: its leading blocks, and the units holding them, are known.

Bounded by the tokens held (4 bytes each), the least recently used conversation out first.
Each gateway process keeps its own: a worker finds the turns that it served.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import orjson


def digest(messages: Sequence[Any]) -> bytes:
    """A conversation's messages, as a key (the members' order does not matter)."""
    return hashlib.blake2b(
        orjson.dumps(messages, option=orjson.OPT_SORT_KEYS), digest_size=16
    ).digest()


def keys(messages: object) -> tuple[bytes | None, bytes | None]:
    """(the key this request's prompt ids are kept under, the key of its earlier turn, if it
    continues one); (None, None) for messages that are not a list.

    Both are `digest`s, of the messages and of all but the last two, with each message
    serialised once: orjson writes a list as "[", its items joined by ",", and "]", so the
    earlier turn's digest is a copy of the hash taken on the way."""
    if not isinstance(messages, list) or not messages:
        return None, None
    answer = messages[-2] if len(messages) >= 3 else None
    continues = isinstance(answer, dict) and answer.get("role") == "assistant"
    cut = len(messages) - 2 if continues else -1
    h = hashlib.blake2b(b"[", digest_size=16)
    earlier = None
    for i, message in enumerate(messages):
        if i == cut:
            closed = h.copy()
            closed.update(b"]")
            earlier = closed.digest()
        if i:
            h.update(b",")
        h.update(orjson.dumps(message, option=orjson.OPT_SORT_KEYS))
    h.update(b"]")
    return h.digest(), earlier


class Turns:
    def __init__(self, capacity: int) -> None:
        """`capacity`: the tokens held at most, over every conversation."""
        self.capacity = capacity
        # Whether any unit's cache is known (its KV events read): until then nothing is kept,
        # nor any request's messages digested.
        self.active = False
        self.tokens = 0
        self.hits = self.misses = 0
        self._kept: OrderedDict[bytes, array[int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def peek(self, key: bytes) -> array[int] | None:
        """What is kept under `key`, not counted as a lookup (for the tests and the admin)."""
        return self._kept.get(key)

    def get(self, key: bytes) -> array[int] | None:
        found = self._kept.get(key)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self._kept.move_to_end(key)
        return found

    def put(self, key: bytes, ids: array[int]) -> None:
        """Keep a turn's prompt ids (a turn longer than the whole store is not kept)."""
        if len(ids) > self.capacity:
            return
        old = self._kept.pop(key, None)
        if old is not None:
            self.tokens -= len(old)
        self._kept[key] = ids
        self.tokens += len(ids)
        while self.tokens > self.capacity:
            _, out = self._kept.popitem(last=False)
            self.tokens -= len(out)
