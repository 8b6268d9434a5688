"""A gap in llguidance's number ranges, closed before a schema reaches it.

llguidance (1.7 to 1.9) compiles a `number` range whose exclusive bound is a whole number and
that spans at most 1 into a grammar that lets the bound itself through: `exclusiveMinimum: 0`
with `maximum: 0.5` allows `0`. (Wider ranges, integers and inclusive bounds are exact; a
sweep over bounds in tests/engine/test_grammar_bounds.py keeps that checked.) Such a range is
refused with strict, naming the keyword; without strict the bound is made inclusive, as
lenient mode ignores what cannot be enforced.
"""

from __future__ import annotations

from typing import Any

from engine.grammar.errors import GrammarError

_PAIRS = (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum"))


def exact_number_ranges(schema: Any, strict: bool, where: str = "schema") -> Any:
    """`schema`, with the ranges llguidance would get wrong refused or made inclusive."""
    if isinstance(schema, list):
        return [exact_number_ranges(v, strict, f"{where}[{i}]") for i, v in enumerate(schema)]
    if not isinstance(schema, dict):
        return schema
    out = {k: exact_number_ranges(v, strict, f"{where}.{k}") for k, v in schema.items()}
    for exclusive, inclusive in _PAIRS:
        if _inexact(out, exclusive):
            if strict:
                bound = out[exclusive]
                raise GrammarError(
                    f"{where}.{exclusive}: {bound} on a number range narrower than 1 is not "
                    f"enforced exactly by the grammar library ({bound} itself would pass); "
                    f"use '{inclusive}' with a value past {bound}, or a wider range"
                )
            out[inclusive] = out.pop(exclusive)
    return out


def _inexact(schema: dict[str, Any], exclusive: str) -> bool:
    bound = schema.get(exclusive)
    if schema.get("type") != "number" or not _whole(bound):
        return False
    low = _first(schema, "exclusiveMinimum", "minimum")
    high = _first(schema, "exclusiveMaximum", "maximum")
    return low is not None and high is not None and high - low <= 1


def _whole(value: Any) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and float(value).is_integer()
    )


def _first(schema: dict[str, Any], *names: str) -> float | None:
    for name in names:
        value = schema.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None
