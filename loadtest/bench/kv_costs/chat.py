"""Section 3a: a chat request's prompt ids as the request path computes them (`Prompts.ids`:
the chat template rendered, the text split at the added tokens, each piece's ids taken from
the piece cache or from the tokenizer), with SmolLM2's tokenizer and template.

A request is a system prompt and a question of about 32 words; `first` has a system prompt
never seen (every piece tokenized), `repeated` the one every request before had (only the
question is). The text is words of the tokenizer's own vocabulary (its whole-word tokens),
drawn by Zipf's law over their ids (a BPE vocabulary's ids run roughly from frequent merges
to rare ones), in sentences of 12: prose-like for the tokenizer's own word cache, which the
first requests warm as a gateway's first minutes would.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from gateway.kvevents.prompts import Prompts
from loadtest.bench.kv_costs.timing import cpu_us_each

MODEL = "smollm2"
SIZES = (500, 2000, 8000)
QUESTION_WORDS = 32
SENTENCE = 12
WORD_BUDGET = 100_000  # prompt tokens tokenized per size for `first` (at least 8 requests)
REPEATED = 100  # requests per size with the repeated system prompt


def export_smollm2(folder: Path) -> Path:
    """SmolLM2's tokenizer files, exported from the packaged GGUF (nothing downloaded)."""
    from engine.model.export import export_tokenizer  # torch: imported only when asked
    from engine.model.gguf import GGUFFile, gguf_path

    export_tokenizer(GGUFFile(gguf_path("smollm2")), folder)
    return folder


class Text:
    def __init__(self, tokenizer: Tokenizer, seed: int) -> None:
        vocab = tokenizer.get_vocab()
        whole = sorted((i, t[1:]) for t, i in vocab.items() if t[:1] == "Ġ" and _word(t[1:]))
        self.words = [w for _, w in whole]
        self.cumulative = list(accumulate(1 / rank for rank in range(1, len(whole) + 1)))
        self._rng = random.Random(seed)

    def __call__(self, words: int) -> str:
        picked = self._rng.choices(self.words, cum_weights=self.cumulative, k=words)
        sentences = (picked[i : i + SENTENCE] for i in range(0, words, SENTENCE))
        return " ".join(" ".join(s).capitalize() + "." for s in sentences)


def _word(text: str) -> bool:
    """A token that reads as a word (not a fragment a merge made early, such as "t")."""
    return text.isascii() and text.isalpha() and (len(text) > 1 or text in ("a", "I"))


def _request(system: str, question: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": MODEL, "messages": messages, "max_tokens": 64}


def _system_words(prompts: Prompts, text: Text, tokens: int) -> int:
    """The system prompt's words for a request of about `tokens` prompt tokens."""
    sample = _request(text(2_000), text(QUESTION_WORDS))
    ids = prompts.ids(MODEL, True, sample)
    assert ids is not None, "SmolLM2's template renders a system prompt and a question"
    per_word = len(ids) / (2_000 + QUESTION_WORDS)
    return max(1, round(tokens / per_word) - QUESTION_WORDS)


def run(folder: Path, sizes: Sequence[int], seed: int, scale: float = 1.0) -> list[dict[str, Any]]:
    prompts = Prompts({MODEL: str(folder)})
    text = Text(Tokenizer.from_file(str(folder / "tokenizer.json")), seed)
    rows = []
    for size in sizes:
        words = _system_words(prompts, text, size)
        firsts = max(8, int(WORD_BUDGET * scale) // size)
        first = [_request(text(words), text(QUESTION_WORDS)) for _ in range(firsts)]
        system = text(words)
        repeated = [
            _request(system, text(QUESTION_WORDS)) for _ in range(max(8, int(REPEATED * scale)))
        ]
        prompts.ids(MODEL, True, repeated[0])  # the system prompt is now in the piece cache
        first_us = cpu_us_each(lambda data: prompts.ids(MODEL, True, data), first)
        repeated_us = cpu_us_each(lambda data: prompts.ids(MODEL, True, data), repeated[1:])
        tokens = statistics.median(len(prompts.ids(MODEL, True, r) or ()) for r in first)
        rows.append(
            {
                "prompt_tokens": size,
                "measured_tokens": tokens,
                "requests_first": len(first),
                "first_us": first_us,
                "first_us_per_token": first_us / tokens,
                "repeated_us": repeated_us,
            }
        )
    return rows
