"""The one error this package raises for a grammar that cannot constrain generation."""

from __future__ import annotations


class GrammarError(ValueError):
    """The message says why the grammar cannot be used (a client's 400): an invalid schema or
    lark text, a JSON Schema keyword strict mode cannot enforce, a special token this model's
    tokenizer lacks, or a token the grammar does not allow."""
