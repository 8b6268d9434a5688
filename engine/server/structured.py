"""Structured output fields -> one grammar for the engine, or a 400 that says why not.

Two spellings ask for the same thing: OpenAI's `response_format` (`json_object`, `json_schema`
with `strict`) and vLLM's `structured_outputs` (`json`, `json_object`, `regex`, `choice`,
`grammar` in llguidance's lark syntax). A request may use one constraint at most: tool calls
with `required` or a named function are a constraint too, and two cannot both hold.

`strict` follows OpenAI: with `strict: true` every schema keyword is enforced or the request is
refused naming the keyword; without it, keywords the grammar library cannot enforce are
ignored (the answer is still JSON of the schema's shape).
"""

from __future__ import annotations

from typing import Any

import orjson

from engine.grammar import (
    GrammarError,
    choice_grammar,
    json_object_grammar,
    json_schema_grammar,
    lark_grammar,
    regex_grammar,
)
from engine.server.errors import JSON, bad
from engine.server.fields import short

# vLLM's structured_outputs keys this engine honours; each is one kind of constraint.
_KINDS = ("json", "json_object", "regex", "choice", "grammar")
# Accepted because they cannot change what a grammar allows here.
_NEUTRAL_KEYS = ("disable_fallback", "disable_any_whitespace", "disable_additional_properties")


def response_format_grammar(value: Any) -> str | None:
    """`response_format`: None for text, else the grammar; a 400 naming the bad part."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("'response_format' must be an object", "response_format")
    kind = value.get("type")
    extra = set(value) - {"type", "json_schema"}
    if extra:
        name = sorted(extra)[0]
        raise bad(f"Unrecognized argument 'response_format.{name}'", f"response_format.{name}")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object_grammar()
    if kind != "json_schema":
        message = "'response_format.type' must be 'text', 'json_object' or 'json_schema'"
        raise bad(f"{message}, got {kind!r}", "response_format.type")
    spec = value.get("json_schema")
    param = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise bad(f"'{param}' is required with type 'json_schema' and must be an object", param)
    unknown = set(spec) - {"name", "description", "schema", "strict"}
    if unknown:
        name = sorted(unknown)[0]
        raise bad(f"Unrecognized argument '{param}.{name}'", f"{param}.{name}")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise bad(f"'{param}.name' is required and must be a non-empty string", f"{param}.name")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad(f"'{param}.strict' must be a boolean", f"{param}.strict")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise bad(f"'{param}.schema' must be a JSON Schema object", f"{param}.schema")
    return _compiled(lambda: json_schema_grammar(schema, bool(strict)), f"{param}.schema")


def structured_outputs_grammar(value: Any) -> str | None:
    """vLLM's `structured_outputs`: exactly one of json, json_object, regex, choice, grammar."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("'structured_outputs' must be an object", "structured_outputs")
    for name, item in value.items():
        if name not in _KINDS and name not in _NEUTRAL_KEYS and item not in (None, False):
            param = f"structured_outputs.{name}"
            raise bad(f"'{param}' is not supported by this engine (got {short(item)})", param)
    asked = [k for k in _KINDS if value.get(k) not in (None, False)]
    if len(asked) != 1:
        message = f"'structured_outputs' must set exactly one of {', '.join(_KINDS)}"
        raise bad(f"{message}; got {asked or 'none'}", "structured_outputs")
    kind = asked[0]
    param = f"structured_outputs.{kind}"
    item = value[kind]
    if kind == "json":
        schema = _schema(item, param)
        return _compiled(lambda: json_schema_grammar(schema, True), param)
    if kind == "json_object":
        if item is not True:
            raise bad(f"'{param}' must be true", param)
        return json_object_grammar()
    if kind == "choice":
        ok = isinstance(item, list) and item and all(isinstance(c, str) for c in item)
        if not ok:
            raise bad(f"'{param}' must be a non-empty array of strings", param)
        return _compiled(lambda: choice_grammar(item), param)
    if not isinstance(item, str) or not item:
        raise bad(f"'{param}' must be a non-empty string", param)
    if kind == "regex":
        return _compiled(lambda: regex_grammar(item), param)
    return _compiled(lambda: lark_grammar(item), param)


def _schema(item: Any, param: str) -> JSON:
    """vLLM takes the schema as an object or as its JSON text."""
    if isinstance(item, str):
        try:
            item = orjson.loads(item)
        except orjson.JSONDecodeError as exc:
            raise bad(f"'{param}' is not valid JSON: {exc}", param) from None
    if not isinstance(item, dict):
        raise bad(f"'{param}' must be a JSON Schema object", param)
    return item


def _compiled(build: Any, param: str) -> str:
    try:
        grammar: str = build()
    except GrammarError as exc:
        raise bad(f"'{param}' cannot be used for constrained decoding: {exc}", param) from None
    return grammar
