"""Structured output for the builtin engine, on llguidance: request -> grammar text (`specs`),
a check against the engine's tokenizer, and per-sequence matchers that fill next-token masks.

Grammars are lazy (no compile per schema ahead of time: a check is under a millisecond, a
matcher about one) and lark grammars may embed `%json{...}`, so a tool call (tag + the tool's
schema) or "text or a call" is one grammar.
"""

from engine.grammar.bitmask import unpack_bits
from engine.grammar.errors import GrammarError
from engine.grammar.llguidance_backend import GrammarBackend, Matcher
from engine.grammar.specs import (
    choice_grammar,
    json_object_grammar,
    json_schema_grammar,
    lark_grammar,
    regex_grammar,
)

__all__ = [
    "GrammarBackend",
    "GrammarError",
    "Matcher",
    "choice_grammar",
    "json_object_grammar",
    "json_schema_grammar",
    "lark_grammar",
    "regex_grammar",
    "unpack_bits",
]
