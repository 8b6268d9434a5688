"""Model names between the client and a unit that serves the public model under another name.

A unit's `served_model` is what its server calls the model the gateway publishes under a
public id. Requests to it carry the served name (`for_unit`); its answers, streamed or whole,
have every `"model":"<served>"` turned back into the public id (`Renamer`) before anything
else reads them, so the client, the tracker and a continuation on another unit all see one
name. Only the JSON member is rewritten, never text: a model's name inside generated text is
escaped (`\\"model\\"`) and does not match.

A request that named no model gets the public id it is routed to (`with_model`), for every unit.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.proxy.jsonbody import dumps, first_member, loads_exact


def for_unit(body: bytes, served: str) -> bytes:
    """The request body with its `model` set to the unit's own name for it."""
    data = loads_exact(body)
    if not isinstance(data, dict):  # intake only lets JSON objects through
        raise InvalidRequest("request body must be a JSON object")
    data["model"] = served
    return dumps(data)


def with_model(body: bytes, data: dict[str, Any], model: str) -> bytes:
    """A body that did not name its model (`data`, parsed from it), naming `model`, the one
    the gateway routes it to: this project's engine needs the name, and a vLLM serving
    adapters beside its base model would otherwise answer from the base model. Spliced in
    when `model` is absent; a null or "" is replaced."""
    if "model" in data:
        return for_unit(body, model)
    return first_member(body, b'"model":' + orjson.dumps(model))


class Renamer:
    """Rewrites one answer's bytes as they arrive, in order; a read that ends inside what may
    be the start of a `"model"` member keeps that tail back until the next read (or `flush`):
    it ends inside a JSON event, which the client could not use yet anyway."""

    __slots__ = ("carry", "pairs", "prefixes")

    def __init__(self, served: str, public: str) -> None:
        old, new = orjson.dumps(served), orjson.dumps(public)
        self.pairs = (
            (b'"model":' + old, b'"model":' + new),
            (b'"model": ' + old, b'"model": ' + new),
        )
        longest = max(len(old) for old, _ in self.pairs)
        # Every proper prefix a read can end with, longest first.
        self.prefixes = tuple(
            sorted(
                {old[:n] for old, _ in self.pairs for n in range(1, min(len(old), longest))},
                key=len,
                reverse=True,
            )
        )
        self.carry = b""

    def feed(self, data: bytes) -> bytes:
        if self.carry:
            data, self.carry = self.carry + data, b""
        for old, new in self.pairs:
            if old in data:
                data = data.replace(old, new)
        if data and data[-1:] != b"\n":
            for prefix in self.prefixes:
                if data.endswith(prefix):
                    data, self.carry = data[: -len(prefix)], prefix
                    break
        return data

    def flush(self) -> bytes:
        out, self.carry = self.carry, b""
        return out

    def whole(self, body: bytes) -> bytes:
        """A complete answer's body."""
        return self.feed(body) + self.flush()
