"""JSON Schema grammars: random walks through drawn schemas end in JSON the schema accepts
(jsonschema is the oracle), and what strict and lenient mode do with what llguidance lacks."""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import HealthCheck, assume, given, reject, settings
from hypothesis import strategies as st

from engine.grammar import GrammarError, json_schema_grammar
from engine.grammar.bounds import exact_number_ranges
from tests.engine.grammar_support import TOKENIZERS, tokenizer_and_backend, walk

Schema = dict[str, Any]

# Keys and strings with what JSON must escape (quotes, backslashes, control characters)
# and characters that are several UTF-8 bytes (split across byte tokens).
TEXT = st.text(alphabet='ab_ "\\\n\té日🙂', max_size=4)
BOUND = st.integers(-1000, 1000)


@st.composite
def integers(draw: st.DrawFn) -> Schema:
    schema: Schema = {"type": "integer"}
    low, high = sorted((draw(BOUND), draw(BOUND)))
    if draw(st.booleans()):
        schema["minimum"] = low
    if draw(st.booleans()):
        schema["maximum"] = high
    return schema


@st.composite
def numbers(draw: st.DrawFn) -> Schema:
    schema: Schema = {"type": "number"}
    low = draw(BOUND) / 8
    high = low + draw(st.integers(1, 2000)) / 8
    if draw(st.booleans()):
        schema["exclusiveMinimum" if draw(st.booleans()) else "minimum"] = low
    if draw(st.booleans()):
        schema["exclusiveMaximum" if draw(st.booleans()) else "maximum"] = high
    return schema


@st.composite
def strings(draw: st.DrawFn) -> Schema:
    longest = draw(st.integers(0, 6))
    schema: Schema = {"type": "string", "maxLength": longest}
    if draw(st.booleans()):
        schema["minLength"] = draw(st.integers(0, longest))
    return schema


VALUES = st.one_of(TEXT, st.integers(-5, 5), st.booleans(), st.none())
LEAVES = st.one_of(
    integers(),
    numbers(),
    strings(),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(VALUES, min_size=1, max_size=4, unique_by=json.dumps).map(lambda v: {"enum": v}),
)


@st.composite
def objects(draw: st.DrawFn, children: st.SearchStrategy[Schema]) -> Schema:
    properties = draw(st.dictionaries(TEXT.filter(bool), children, max_size=4))
    required = [key for key in properties if draw(st.booleans())]
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


@st.composite
def arrays(draw: st.DrawFn, children: st.SearchStrategy[Schema]) -> Schema:
    fewest, most = sorted((draw(st.integers(0, 3)), draw(st.integers(0, 3))))
    return {"type": "array", "items": draw(children), "minItems": fewest, "maxItems": most}


SCHEMAS = st.recursive(
    LEAVES, lambda children: st.one_of(objects(children), arrays(children)), max_leaves=8
)


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(schema=SCHEMAS, strict=st.booleans(), seed=st.integers(0, 2**32))
def test_walks_end_in_valid_json(name: str, schema: Schema, strict: bool, seed: int) -> None:
    """Valid against the schema; without strict, against the schema as enforced (a number
    range llguidance gets wrong made inclusive: engine/grammar/bounds.py)."""
    try:
        grammar = json_schema_grammar(schema, strict)
    except GrammarError as exc:  # strict refuses such a range, naming it
        assert strict and "narrower than 1" in str(exc)
        reject()
    text = walk(name, grammar, random.Random(seed))
    assume(text is not None)
    assert text is not None
    jsonschema.validate(json.loads(text), exact_number_ranges(schema, strict))


# Keywords llguidance cannot enforce, each with a schema using it and the shape (the schema
# without it) that lenient mode still guarantees.
UNSUPPORTED: dict[str, tuple[Schema, Schema]] = {
    "uniqueItems": ({"uniqueItems": True}, {"type": "array", "items": {"type": "boolean"}}),
    "contains": ({"contains": {"const": True}}, {"type": "array", "items": {"type": "boolean"}}),
    "not": ({"not": {"const": "a"}}, {"type": "string", "maxLength": 3}),
    "propertyNames": (
        {"propertyNames": {"maxLength": 1}},
        {"type": "object", "properties": {"ab": {"type": "null"}}, "required": ["ab"]},
    ),
    "dependentRequired": (
        {"dependentRequired": {"a": ["b"]}},
        {"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}}},
    ),
    "if": (
        {"if": {"required": ["a"]}, "then": {"required": ["b"]}},
        {"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}}},
    ),
    "format": ({"format": "color"}, {"type": "string", "maxLength": 3}),
}


def _shape(name: str) -> Schema:
    shape = UNSUPPORTED[name][1]
    if shape["type"] == "array":
        return {**shape, "maxItems": 3}
    if shape["type"] == "object":
        return {**shape, "additionalProperties": False}
    return shape


@pytest.mark.parametrize("keyword", UNSUPPORTED)
def test_strict_names_the_keyword_it_cannot_enforce(keyword: str) -> None:
    schema = {**_shape(keyword), **UNSUPPORTED[keyword][0]}
    with pytest.raises(GrammarError, match=keyword):
        json_schema_grammar(schema, strict=True)


@pytest.mark.parametrize("keyword", UNSUPPORTED)
def test_lenient_ignores_it_and_keeps_the_shape(keyword: str) -> None:
    schema = {**_shape(keyword), **UNSUPPORTED[keyword][0]}
    grammar = json_schema_grammar(schema, strict=False)
    for name in TOKENIZERS:
        tokenizer_and_backend(name)[1].check(grammar)
        for seed in range(5):
            text = walk(name, grammar, random.Random(seed))
            assert text is not None
            jsonschema.validate(json.loads(text), _shape(keyword))


def test_overlapping_one_of_is_any_of_when_lenient() -> None:
    schema = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    with pytest.raises(GrammarError, match="oneOf"):
        json_schema_grammar(schema, strict=True)
    json_schema_grammar(schema, strict=False)
    json_schema_grammar({"oneOf": [{"type": "integer"}, {"type": "string"}]}, strict=True)


def test_a_schema_cannot_turn_strict_off() -> None:
    schema = {"type": "array", "uniqueItems": True, "x-guidance": {"lenient": True}}
    with pytest.raises(GrammarError, match="uniqueItems"):
        json_schema_grammar(schema, strict=True)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ([{"type": "object"}], "must be an object, got list"),
        (True, "must be an object, got bool"),
        ("{}", "must be an object, got str"),
        ({"type": "object", "x-guidance": 1}, "x-guidance"),
        ({"type": "thing"}, "Invalid type"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "Unsatisfiable"),
        ({"type": "integer", "minimum": "0"}, "minimum"),
        ({"type": "string", "pattern": "(("}, "unclosed group"),
        ({"$ref": "https://example.com/schema.json"}, "example.com"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "missing"),
    ],
)
def test_invalid_schemas_fail_in_both_modes(schema: object, message: str) -> None:
    for strict in (True, False):
        with pytest.raises(GrammarError, match=message):
            json_schema_grammar(schema, strict)


def test_annotations_and_unknown_keywords_are_ignored() -> None:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "T",
        "description": "d",
        "type": "object",
        "properties": {"a": {"type": "string", "examples": ["x"], "default": "x", "foo": 1}},
    }
    json_schema_grammar(schema, strict=True)
