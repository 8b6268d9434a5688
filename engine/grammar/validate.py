"""Checking llguidance grammar text, with or without a tokenizer, as a `GrammarError`.

Without a tokenizer the check is the grammar's own (lark syntax, the JSON Schema's keywords,
regexes); with one it also resolves special tokens (`<|im_end|>`) against the vocabulary.
Either takes well under a millisecond for an ordinary schema.
"""

from __future__ import annotations

import llguidance

from engine.grammar.errors import GrammarError

# Default limits, but errors without the parser state and grammar dump: they go to clients.
LIMITS = llguidance.LLParserLimits(verbose_errors=False)


def validate(grammar: str, tokenizer: llguidance.LLTokenizer | None = None) -> None:
    """Raise GrammarError when llguidance cannot build a matcher for `grammar`."""
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        grammar, tokenizer, limits=LIMITS
    )
    if failed:
        raise GrammarError(messages[0].strip() if messages else "invalid grammar")
