"""Bodies the gateway sends on: the client's bytes with members spliced in, and where a body
must be rewritten, every integer as the client wrote it (orjson alone makes one beyond 64 bits
a float, and refuses to write it)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.proxy.continuation import asking_token_ids, carried_exactly, resumable
from gateway.proxy.jsonbody import dumps, first_member, loads_exact
from gateway.proxy.names import for_unit, with_model

BIG = 2**64  # one past uint64
SMALL = -(2**63) - 1  # one below int64


def test_integers_beyond_64_bits_are_read_and_written_exactly() -> None:
    body = b'{"a": %d, "b": [%d, 1.5, 1e+16], "c": "x\\u00e9"}' % (BIG, SMALL)
    assert isinstance(orjson.loads(body)["a"], float)  # why loads_exact exists
    data = loads_exact(body)
    assert data == {"a": BIG, "b": [SMALL, 1.5, 1e16], "c": "x\u00e9"}
    assert dumps(data) == b'{"a":%d,"b":[%d,1.5,1e+16],"c":"x\xc3\xa9"}' % (BIG, SMALL)


def test_a_body_without_long_numbers_is_read_once() -> None:
    body = b'{"a": 18446744073709551615, "b": "1234567890123456789"}'  # uint64 max: orjson's
    assert loads_exact(body) == orjson.loads(body)


def test_deep_nesting_is_written_past_orjsons_limit() -> None:
    deep: list[Any] = []
    for _ in range(300):
        deep = [deep]
    assert dumps(deep) == b"[" * 301 + b"]" * 301


@pytest.mark.parametrize(
    ("body", "spliced"),
    [
        (b'{"a": 1}', b'{"m":2,"a": 1}'),
        (b"  {  }  ", b'  {"m":2  }  '),
        (b"{}", b'{"m":2}'),
        (b'\n{\n"a":[]}', b'\n{"m":2,\n"a":[]}'),
    ],
)
def test_a_member_is_spliced_in_first(body: bytes, spliced: bytes) -> None:
    assert first_member(body, b'"m":2') == spliced
    assert orjson.loads(spliced)["m"] == 2


def test_token_ids_are_asked_for_with_the_clients_bytes() -> None:
    body = b'{"model": "m", "seed": %d}' % SMALL
    assert asking_token_ids(body, orjson.loads(body)) == b'{"return_token_ids":true,' + body[1:]
    asked = b'{"return_token_ids": true, "seed": %d}' % SMALL
    assert asking_token_ids(asked, orjson.loads(asked)) is asked
    refused = b'{"return_token_ids": false, "seed": %d}' % SMALL
    assert asking_token_ids(refused, orjson.loads(refused)) == (
        b'{"return_token_ids":true,"seed":%d}' % SMALL
    )


def test_a_left_out_model_is_named() -> None:
    body = b'{"prompt": "x", "seed": %d}' % BIG
    assert with_model(body, orjson.loads(body), "m") == b'{"model":"m",' + body[1:]
    null = b'{"model": null, "prompt": "x", "seed": %d}' % BIG
    assert with_model(null, orjson.loads(null), "m") == (
        b'{"model":"m","prompt":"x","seed":%d}' % BIG
    )
    assert for_unit(null, "smol") == b'{"model":"smol","prompt":"x","seed":%d}' % BIG


def test_a_continuation_carries_the_clients_integers() -> None:
    body = b'{"stream": true, "seed": 1, "stop_token_ids": [%d], "max_tokens": 5}' % BIG
    assert carried_exactly(body, orjson.loads(body)) == {
        "seed": 1,
        "stop_token_ids": [BIG],
        "max_tokens": 5,
    }


@pytest.mark.parametrize(
    ("extra", "resumed"),
    [
        ({}, True),
        ({"n": 1, "max_tokens": 5, "min_tokens": None}, True),
        ({"n": True}, False),
        ({"max_tokens": "5"}, False),
        ({"max_completion_tokens": 5.0}, False),
        ({"min_tokens": [1]}, False),
        ({"prompt_embeds": "AAAA"}, False),
    ],
)
def test_only_plain_budgets_are_resumed(extra: dict[str, Any], resumed: bool) -> None:
    """The gateway no longer refuses a budget it cannot read: it relays that stream as is."""
    assert resumable({"stream": True, "prompt": "x", **extra}, chat=False) is resumed
