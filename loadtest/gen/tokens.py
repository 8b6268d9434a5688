"""Counting and cutting text in the model's own tokens, when a tokenizer is at hand locally.

A tokenizer comes from `--tokenizer PATH` (a Hugging Face folder with `tokenizer.json`, that
file itself, or a `.gguf` file), or, for a model the engine ships as a package (the demo's
SmolLM2-135M-Instruct), from that package's GGUF. Nothing is ever downloaded. Without one,
prompt lengths in tokens are approximated from words and the report says so.

A prompt of N tokens is the prompt text (the chat messages' content, or the completions
`prompt`) encoded to exactly N ids by this tokenizer; a chat server adds its template's tokens
on top, which the server's usage (`prompt tokens`) shows next to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

# Words per token of English prose (OpenAI's rule of thumb), used only without a tokenizer.
WORDS_PER_TOKEN = 0.75
_CACHE_LIMIT = 4096
_SEARCH = 4  # cut points tried on either side of N when a re-encoding drifts


class TokenizerError(ValueError):
    """A tokenizer the user named cannot be loaded; the message names the path and why."""


@dataclass(slots=True)
class TokenCounter:
    """A `tokenizers.Tokenizer` used without special tokens; `source` says where it came from."""

    tok: Tokenizer
    source: str
    _fitted: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.tok.encode(text, add_special_tokens=False).ids
        return ids

    def decode(self, ids: list[int]) -> str:
        text: str = self.tok.decode(ids, skip_special_tokens=True)
        return text

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def fit(self, text: str, n: int, filler: str) -> tuple[str, int]:
        """`text` padded with `filler` or cut to `n` tokens, and the count it really has.

        Decoding a prefix of ids and encoding it again can merge differently at the cut, so a
        few cut points around `n` are tried; the count returned is always the re-encoded one.
        """
        key = (text, n)
        if (hit := self._fitted.get(key)) is not None:
            return hit
        if len(self._fitted) >= _CACHE_LIMIT:
            self._fitted.clear()
        self._fitted[key] = found = self._fit(text, n, filler)
        return found

    def _fit(self, text: str, n: int, filler: str) -> tuple[str, int]:
        ids = self.encode(text)
        pad = self.encode(" " + filler)
        while len(ids) < n + _SEARCH:
            ids += pad
        best: tuple[str, int] | None = None
        for cut in _cuts(n, len(ids)):
            candidate = self.decode(ids[:cut])
            got = self.count(candidate)
            if got == n:
                return candidate, got
            if best is None or abs(got - n) < abs(best[1] - n):
                best = (candidate, got)
        assert best is not None
        return best


def _cuts(n: int, limit: int) -> list[int]:
    order = [n]
    for step in range(1, _SEARCH + 1):
        order += [n - step, n + step]
    return [c for c in order if 1 <= c <= limit]


def load_tokenizer(path: Path) -> TokenCounter:
    """`tokenizer.json`, a folder holding one, or a `.gguf` file (read with the engine's
    GGUF tokenizer, which needs the `engine` extra)."""
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"--tokenizer {path}: no such file")
    if path.suffix == ".gguf":
        return _from_gguf(path, f"{path}")
    try:
        return TokenCounter(Tokenizer.from_file(str(path)), str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
        raise TokenizerError(f"--tokenizer {path}: not a tokenizer.json ({exc})") from None


def _from_gguf(path: Path, source: str) -> TokenCounter:
    try:
        from engine.model.gguf import GGUFFile, gguf_tokenizer
    except ImportError as exc:
        raise TokenizerError(
            f"--tokenizer {path}: reading a GGUF needs the engine extra ({exc})"
        ) from None
    try:
        return TokenCounter(gguf_tokenizer(GGUFFile(path)).tok, source)
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"--tokenizer {path}: {exc}") from None


def packaged_tokenizer(model: str) -> TokenCounter | None:
    """The tokenizer of a model the engine ships as a package (matched by its served name),
    or None when `model` is not one or its package or the engine extra is not installed."""
    try:
        from engine.model.gguf import PACKAGED, packaged_file
    except ImportError:
        return None
    for key, entry in PACKAGED.items():
        if entry.name.lower() == model.lower():
            try:
                path = packaged_file(key)
                return _from_gguf(path, f"{entry.name} (package {entry.distribution})")
            except (ValueError, TokenizerError):
                return None
    return None


def approx_words(tokens: int) -> int:
    """Words to send for about `tokens` tokens when no tokenizer is known."""
    return max(1, round(tokens * WORDS_PER_TOKEN))


def estimate_tokens(text: str) -> int:
    """Tokens of an answer when neither the server nor a tokenizer counted them."""
    words = len(text.split())
    return max(1, round(words / WORDS_PER_TOKEN)) if words else 0
