"""The shared-prefix workload: groups of requests, each group one long system prompt (the prefix
its requests share) and each request a short question of its own.

Requests go in rounds, every group once a round in a shuffled order: a group comes back only
after most others did, as sessions of many users do, so a unit that caches every group (what
routing by load alone makes of each unit) must hold the whole working set to hit. The texts
and the order come from the seed alone: every mode is sent the same requests in the same order.

Pure: the benchmark measures the prompts' token ids with the model's tokenizer (pressure.py
turns them into blocks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from random import Random
from typing import Any

import orjson

# Common words, most of them one token each: a prefix of N words is about 1.1 N tokens.
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which"
    " but have an they you were her she there been one all we their has would when if so what"
    " no up out into than them can only other new some time could these two may then first any"
    " my now such like our over man me even most made after also did many before must through"
    " back years where much your way well down should because each just those people how too"
    " little state good very make world still own see men work long get here between both life"
    " being under never day same another know while last might us great old year off come since"
    " against go came right used take three"
)
WORDS = tuple(_WORDS.split())
SENTENCE = 12  # words per sentence


@dataclass(frozen=True, slots=True)
class Request:
    group: int
    question: str


@dataclass(frozen=True, slots=True)
class Workload:
    prefixes: tuple[str, ...]  # each group's system prompt
    requests: tuple[Request, ...]  # in the order they are sent

    def messages(self, request: Request) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.prefixes[request.group]},
            {"role": "user", "content": request.question},
        ]

    def bodies(self, model: str, max_tokens: int) -> list[bytes]:
        """Each request's streamed chat completion, encoded once: every mode sends these bytes.
        Greedy, and `ignore_eos` so that every answer has `max_tokens` tokens; the usage chunk
        counts them whatever a router does to the other fields."""
        return [orjson.dumps(body(model, self.messages(r), max_tokens)) for r in self.requests]


def body(model: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def build(
    groups: int, prefix_words: int, rounds: int, seed: int, question_words: int = 8
) -> Workload:
    """`groups` prefixes of `prefix_words` words; `rounds` requests of each group."""
    if min(groups, prefix_words, rounds, question_words) < 1:
        raise ValueError("groups, prefix_words, rounds and question_words must be >= 1")
    rng = Random(seed)
    prefixes = tuple(_prefix(rng, g, prefix_words) for g in range(groups))
    requests = []
    for _ in range(rounds):
        order = list(range(groups))
        rng.shuffle(order)
        requests += [Request(g, _question(rng, question_words)) for g in order]
    return Workload(prefixes, tuple(requests))


def _prefix(rng: Random, group: int, words: int) -> str:
    """A system prompt that differs from every other group's from its first words on (so the
    approximate hash of its first characters tells groups apart, as real prompts' would)."""
    head = f"You are assistant number {group} and you answer in the style of these notes."
    return head + " " + _sentences(rng, words)


def _question(rng: Random, words: int) -> str:
    return _sentences(rng, words).rstrip(".") + "?"


def _sentences(rng: Random, words: int) -> str:
    picked = [rng.choice(WORDS) for _ in range(words)]
    return " ".join(_sentence(picked[i : i + SENTENCE]) for i in range(0, words, SENTENCE))


def _sentence(words: Sequence[str]) -> str:
    return " ".join(words).capitalize() + "."
