"""The number ranges llguidance gets wrong, found by a sweep: each is refused with strict and
made inclusive without it; every other range of the sweep decodes exactly what JSON Schema
allows (a new llguidance that changes either shows here)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from engine.grammar import GrammarBackend, GrammarError, json_schema_grammar
from engine.grammar.bounds import exact_number_ranges
from engine.model.tokenizer import ByteTokenizer

TOKENIZER = ByteTokenizer()
BACKEND = GrammarBackend(TOKENIZER, TOKENIZER.vocab_size)
EOS = TOKENIZER.eos_id
BOUNDS = (-1.5, -1, -0.5, 0, 0.5, 1, 2)
NUMBERS = ("0", "-0", "0.5", "1", "1.5", "2", "-1", "-0.5", "-1.5", "0.25", "1.25", "-0.25")


def accepts(grammar: str, text: str) -> bool:
    matcher = BACKEND.matcher(grammar)
    try:
        for byte in text.encode():
            matcher.accept(byte)
        assert EOS is not None
        matcher.accept(EOS)
    except GrammarError:
        return False
    return True


def valid(value: str, schema: dict[str, Any]) -> bool:
    try:
        jsonschema.validate(json.loads(value), schema)
    except jsonschema.ValidationError:
        return False
    return True


def ranges() -> list[dict[str, Any]]:
    out = []
    for low, high in itertools.product((None, *BOUNDS), (None, *BOUNDS)):
        if low is not None and high is not None and low >= high:
            continue
        for low_ex, high_ex in itertools.product((False, True), repeat=2):
            schema: dict[str, Any] = {"type": "number"}
            if low is not None:
                schema["exclusiveMinimum" if low_ex else "minimum"] = low
            if high is not None:
                schema["exclusiveMaximum" if high_ex else "maximum"] = high
            out.append(schema)
    return out


def test_no_range_lets_through_a_number_outside_it() -> None:
    refused = 0
    for schema in ranges():
        enforced = schema
        try:
            grammar = json_schema_grammar(schema, strict=True)
        except GrammarError as exc:
            assert "narrower than 1" in str(exc), exc
            refused += 1
            grammar = json_schema_grammar(schema, strict=False)
            enforced = exact_number_ranges(schema, strict=False)
        for number in NUMBERS:
            if accepts(grammar, number):
                assert valid(number, enforced), (schema, number)
    assert refused > 0  # the sweep does reach the ranges llguidance gets wrong


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "number", "exclusiveMinimum": 0, "maximum": 0.5}, "exclusiveMinimum"),
        ({"type": "number", "minimum": -1.5, "exclusiveMaximum": -1}, "exclusiveMaximum"),
    ],
)
def test_strict_names_the_bound_lenient_makes_it_inclusive(
    schema: dict[str, Any], keyword: str
) -> None:
    nested = {"type": "object", "properties": {"x": schema}}
    with pytest.raises(GrammarError, match=rf"schema\.properties\.x\.{keyword}"):
        json_schema_grammar(nested, strict=True)
    made = exact_number_ranges(nested, strict=False)
    assert keyword not in made["properties"]["x"]
    assert made["properties"]["x"][keyword.replace("exclusiveM", "m")] == schema[keyword]
