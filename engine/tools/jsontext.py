"""JSON read from model text and written back compact, without changing a number.

Numbers are kept as the model wrote them (`633E3` stays `633E3`, `1e400` does not become
`Infinity`, a 30-digit integer is not rounded); NaN and Infinity, which Python's decoder
accepts, are refused as the JSON they are not. Strings are written as UTF-8, except one that
holds a lone surrogate (from an escape like `\\ud800`), written with ASCII escapes so that the
text can still be encoded.
"""

from __future__ import annotations

import json
from typing import Any


class Number(str):
    """A JSON number's text, as decoded."""


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


DECODER = json.JSONDecoder(parse_float=Number, parse_int=Number, parse_constant=_refuse)


def compact(value: Any) -> str:
    """The value decoded by DECODER as JSON text with no whitespace between tokens."""
    if isinstance(value, Number):
        return str(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, dict):
        items = (f"{_string(key)}:{compact(item)}" for key, item in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(compact(item) for item in value) + "]"
    return json.dumps(value)  # true, false, null


def _string(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(text)
    return json.dumps(text, ensure_ascii=False)
