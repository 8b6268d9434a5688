"""Request bodies the gateway reads again, builds and keeps for a request's whole life.

A unit gets the client's own bytes wherever the gateway adds nothing. Where it adds a member
the client left out (the model it routed to, `return_token_ids`, a class's `priority`), the
member is spliced in first (`first_member`) and the rest stays byte for byte. Only a body whose
member must change is read again and written anew, with every integer kept exact: orjson reads
an integer beyond 64 bits as a float and refuses to write one, so such a body is read again by
the standard library (`loads_exact`) and written by it (`dumps`).

orjson returns its output in the buffer it wrote it in, 4 KB or more even for a 100-byte body
(orjson 3.13 does not shrink it). A body kept for retries and resumption would then hold 4 KB
per open stream; `dumps` hands back a copy of the exact size instead.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

# Every digit as "0", every other byte as " ": an integer orjson cannot hold has 19 digits at
# least (-2**63 - 1), so a body without 19 digits in a row has none.
_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_NUMBER = b"0" * 19


def dumps(obj: Any) -> bytes:
    """`obj` as JSON, in a bytes object no larger than it needs; integers of any size."""
    try:
        return memoryview(orjson.dumps(obj)).tobytes()
    except orjson.JSONEncodeError:  # an integer beyond 64 bits, or nesting past orjson's 254
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def loads_exact(body: bytes) -> Any:
    """`body` (valid JSON: intake has read it) with integers beyond 64 bits as integers."""
    data = orjson.loads(body)
    if body.translate(_DIGITS).find(_LONG_NUMBER) < 0:
        return data
    try:
        return json.loads(body)
    except RecursionError:  # nested past the standard library's depth (orjson's is 1024)
        return data


def first_member(body: bytes, member: bytes) -> bytes:
    """`body` (a JSON object without the member) with `member` (`"name":value`) first."""
    at = body.index(b"{") + 1
    rest = body[at:]
    sep = b"" if rest.lstrip().startswith(b"}") else b","
    return body[:at] + member + sep + rest
