"""Model names toward a unit with its own name for the public model, and back."""

from __future__ import annotations

import json

import orjson
from hypothesis import given
from hypothesis import strategies as st

from gateway.proxy.names import Renamer, for_unit

NAMES = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), min_size=1, max_size=12)


def test_the_request_carries_the_units_name() -> None:
    body = orjson.dumps({"model": "Public", "messages": [{"role": "user", "content": "model"}]})
    assert orjson.loads(for_unit(body, "smol")) == {
        "model": "smol",
        "messages": [{"role": "user", "content": "model"}],
    }


@given(
    served=NAMES,
    public=NAMES,
    texts=st.lists(st.text(max_size=20), max_size=5),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
    spaced=st.booleans(),
)
def test_every_model_member_comes_back_public_however_the_bytes_are_cut(
    served: str, public: str, texts: list[str], cuts: list[int], spaced: bool
) -> None:
    """Text that happens to hold the served name (or a whole `"model":"<served>"`) is JSON-
    escaped inside its string and stays as it is."""
    events = [
        {"id": "x", "model": served, "choices": [{"text": t + f'"model":"{served}"'}]}
        for t in texts
    ] + [{"model": served, "choices": []}]

    def dump(event: dict[str, object]) -> bytes:
        if spaced:  # json.dumps' default separators, as some servers write
            return json.dumps(event, ensure_ascii=False).encode()
        return orjson.dumps(event)

    raw = b"".join(b"data: " + dump(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    names = Renamer(served, public)
    out, at = b"", 0
    for cut in [*sorted({min(c, len(raw)) for c in cuts}), len(raw)]:
        out += names.feed(raw[at:cut])
        at = max(at, cut)
    out += names.flush()
    got = [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e.startswith(b"data: {")]
    assert got == [{**e, "model": public} for e in events]
