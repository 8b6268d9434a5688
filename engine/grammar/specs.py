"""What a request asks for -> llguidance grammar text, checked, or a GrammarError saying why not.

JSON is compact by default (no whitespace outside strings): a model that may write free
whitespace can loop on newlines forever, and the text is then exactly the JSON. A schema may
still set llguidance's own options under `"x-guidance"` (separators, whitespace), except
`lenient`, which `strict` decides:

- strict=True: every keyword is enforced, or GrammarError names the ones llguidance cannot
  enforce (`uniqueItems`, `contains`, `if`/`then`/`else`, `not`, `propertyNames`,
  `dependentRequired`, `unevaluatedProperties`, an unknown `format`, a `oneOf` whose branches
  may overlap, ...).
- strict=False: llguidance's lenient mode; those keywords and unknown formats are ignored and
  an overlapping `oneOf` is treated as `anyOf`, so the output has the schema's shape but may
  break them. Invalid or unsatisfiable schemas (a bad `type`, minimum > maximum, a regex that
  does not parse, a remote `$ref`) fail in both modes.

Not JSON Schema but llguidance: object properties come in the schema's `properties` order.
Annotations (`title`, `description`, `default`, `examples`) and keywords JSON Schema does not
define are ignored, as JSON Schema says.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

import llguidance

from engine.grammar.bounds import exact_number_ranges
from engine.grammar.errors import GrammarError
from engine.grammar.validate import validate

# No whitespace but inside strings; llguidance's separators default to "," and ":".
COMPACT = {"whitespace_flexible": False}


def json_object_grammar() -> str:
    """Any JSON object (OpenAI's `json_object`), compact."""
    return _json_object()


@functools.cache
def _json_object() -> str:
    return json_schema_grammar({"type": "object"}, strict=True)


def json_schema_grammar(schema: object, strict: bool) -> str:
    """The grammar of JSON valid against `schema` (OpenAI's `json_schema`); see the module."""
    grammar = _from_schema(_with_options(exact_number_ranges(schema, strict), strict))
    validate(grammar)
    return grammar


def lark_grammar(lark: str) -> str:
    """llguidance's lark dialect (may embed `%json{...}` and special tokens such as
    `<|im_end|>`, which only `GrammarBackend.check` can resolve)."""
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    validate(grammar)
    return grammar


def regex_grammar(regex: str) -> str:
    """The whole output matches `regex` (Rust regex syntax; no look-around or backreferences)."""
    grammar = llguidance.LLMatcher.grammar_from_regex(regex)
    validate(grammar)
    return grammar


def choice_grammar(choices: Sequence[str]) -> str:
    """Exactly one of `choices`, verbatim."""
    if not choices:
        raise GrammarError("choice: at least one choice is needed")
    alternatives = " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)
    return lark_grammar(f"start: {alternatives}")


def _from_schema(schema: dict[str, Any]) -> str:
    """llguidance's JSON Schema grammar (it checks nothing yet: `validate` does)."""
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema)
    except (TypeError, ValueError) as exc:  # not JSON-serializable
        raise GrammarError(f"the JSON Schema is not JSON: {exc}") from None


def _with_options(schema: object, strict: bool) -> dict[str, Any]:
    """A copy of `schema` with its "x-guidance" options: ours as defaults, the schema's own
    over them, and `lenient` always from `strict`."""
    if not isinstance(schema, dict):
        raise GrammarError(f"a JSON Schema must be an object, got {type(schema).__name__}")
    own = schema.get("x-guidance", {})
    if not isinstance(own, dict):
        raise GrammarError("x-guidance: must be an object")
    return {**schema, "x-guidance": {**COMPACT, **own, "lenient": not strict}}
