"""Hypothesis strategies and settings shared by the fuzz tests.

Every test here runs with `FUZZ` (or a child of it): derandomized, no example database, so CI
replays exactly the same examples on every run and a failure reproduces from the test alone.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from tests.support import MODEL

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,  # the HTTP examples have their own explicit socket deadlines
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Over HTTP an example can cost a timeout (up to seconds): no shrinking, which would replay
# dozens of them, and the first failure is reported as generated.
HTTP_FUZZ = settings(FUZZ, phases=[Phase.explicit, Phase.generate], report_multiple_bugs=False)

# orjson's range: integers within 64 bits, finite floats. Big numbers arrive as floats anyway.
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=25,
)
FIELDS = [
    "model",
    "messages",
    "prompt",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "user",
]


def valid_chat() -> st.SearchStrategy[dict[str, Any]]:
    """Bodies the gateway must accept (the simulated unit serves them)."""
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=60)}
    )
    optional = {
        "stream": st.booleans(),
        "max_tokens": st.integers(1, 8),
        "temperature": st.floats(0.0, 2.0),
        "top_p": st.floats(0.0, 1.0),
        "seed": st.integers(0, 2**31),
        "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=3),
        "user": st.text(max_size=20),
    }
    return st.fixed_dictionaries(
        {"model": st.just(MODEL), "messages": st.lists(message, min_size=1, max_size=4)},
        optional=optional,
    )


@st.composite
def mutated_chat(draw: st.DrawFn) -> dict[str, Any]:
    """A valid body with some known fields replaced by arbitrary JSON or removed."""
    body = draw(valid_chat())
    for name in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3, unique=True)):
        if draw(st.booleans()):
            body[name] = draw(JSON)
        else:
            body.pop(name, None)
    if draw(st.booleans()) and isinstance(body.get("messages"), list) and body["messages"]:
        # Poke inside a message: role, content or the message itself.
        i = draw(st.integers(0, len(body["messages"]) - 1))
        target = draw(st.sampled_from(["role", "content", "whole"]))
        if target == "whole":
            body["messages"][i] = draw(JSON)
        elif isinstance(body["messages"][i], dict):
            body["messages"][i][target] = draw(JSON)
    return body


def nested(depth: int, kind: str) -> bytes:
    """`depth` levels of arrays or objects, as JSON text."""
    if kind == "array":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


@st.composite
def hostile_body(draw: st.DrawFn, max_bytes: int) -> bytes:
    """Raw request bodies: arbitrary JSON, junk bytes, invalid UTF-8, deep nesting, huge strings,
    truncated JSON, around `max_bytes` (the gateway's body limit)."""
    kind = draw(
        st.sampled_from(["json", "mutated", "bytes", "utf8", "deep", "huge", "truncated", "valid"])
    )
    if kind == "json":
        return orjson.dumps(draw(JSON))
    if kind == "mutated":
        return orjson.dumps(draw(mutated_chat()))
    if kind == "valid":
        return orjson.dumps(draw(valid_chat()))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "utf8":
        # A valid body with invalid UTF-8 spliced into a string value.
        bad = draw(
            st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"])
        )
        return b'{"model": "%s", "messages": [{"role": "user", "content": "a%sb"}]}' % (
            MODEL.encode(),
            bad,
        )
    if kind == "deep":
        depth = draw(st.sampled_from([1, 100, 1023, 1024, 1025, 5000, 100_000]))
        inner = nested(min(depth, max_bytes // 8), draw(st.sampled_from(["array", "object"])))
        where = draw(st.sampled_from(["extra", "content", "whole"]))
        if where == "whole":
            return inner
        if where == "content":
            return b'{"model": "%s", "messages": [{"role": "user", "content": %s}]}' % (
                MODEL.encode(),
                inner,
            )
        return b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "x": %s}' % (
            MODEL.encode(),
            inner,
        )
    if kind == "huge":
        size = draw(st.sampled_from([max_bytes // 2, max_bytes - 100, max_bytes, max_bytes + 1]))
        char = draw(st.sampled_from(["x", "é", "\u20ac", "\U0001f600", "\\u0000", '\\"']))
        field = draw(st.sampled_from(["content", "model", "user", "stop"]))
        filler = (char * (size // len(char.encode()) + 1)).encode()[:size]
        text = filler.decode("utf-8", "ignore").rstrip("\\")
        head = f'{{"model":"{MODEL}","messages":[{{"role":"user","content":'
        if field == "content":
            return f'{head}"{text}"}}]}}'.encode()
        return f'{head}"x"}}],"{field}":"{text}"}}'.encode()
    # truncated: a valid body cut anywhere
    whole = orjson.dumps(draw(valid_chat()))
    return whole[: draw(st.integers(0, max(0, len(whole) - 1)))]
