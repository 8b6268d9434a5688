"""JSON Schemas of the admin API's data-plane keys (gateway/admin/keys.py), in the style of
schemas.py; openapi.py puts both in the document."""

from __future__ import annotations

from gateway.admin.schemas import Schema, obj, of, ref
from gateway.auth.spec import MAX_LIMIT, TENANT

LIMIT = of(["integer", "null"], "null: unlimited.", minimum=1, maximum=MAX_LIMIT)
TENANT_NAME = of("string", pattern=f"^{TENANT.pattern}$")

PROPERTIES: dict[str, Schema] = {
    "id": of("string", "Names the key in the API and the events log (not a secret)."),
    "prefix": of("string", "The secret's first characters, to tell keys apart."),
    "tenant": TENANT_NAME,
    "priority": of("string", "The highest priority class its requests may run in."),
    "default_priority": of("string", "The class of its requests that ask for none."),
    "rpm": of(["integer", "null"], "Requests per minute; null: unlimited."),
    "tpm": of(["integer", "null"], "Tokens per minute; null: unlimited."),
    "max_inflight": of(["integer", "null"], "Requests at once; null: unlimited."),
    "expires": of(["number", "null"], "Unix time; null: never."),
    "created": of("number", "Unix time."),
    "who": of("string", "The admin token's name that made it."),
    "revoked": of(["number", "null"], "Unix time of its revocation."),
    "revoked_by": of("string", "The admin token's name that revoked it."),
    "state": of("string", enum=["active", "revoked", "expired"]),
}

KEY = obj(PROPERTIES, about="A key, never its secret.")

CREATED_KEY = obj(
    {**PROPERTIES, "key": of("string", "The secret: shown in this answer only.")},
    about="The key made, with its secret.",
)

KEY_LIST = obj({"keys": of("array", "Oldest first; revoked ones too.", items=ref("Key"))})

NEW_KEY = obj(
    {
        "tenant": TENANT_NAME,
        "priority": of(["string", "null"], "A priority class (default: [priority].default)."),
        "default_priority": of(
            ["string", "null"], "A class not above `priority` (default: `priority`)."
        ),
        "rpm": LIMIT,
        "tpm": LIMIT,
        "max_inflight": LIMIT,
        "expires": {
            "description": "Unix seconds or an RFC 3339 time, in the future; null: never.",
            "oneOf": [
                of("number"),
                of("string", format="date-time"),
                {"type": "null"},
            ],
        },
    },
    "priority",
    "default_priority",
    "rpm",
    "tpm",
    "max_inflight",
    "expires",
)

SCHEMAS: dict[str, Schema] = {
    "Key": KEY,
    "CreatedKey": CREATED_KEY,
    "KeyList": KEY_LIST,
    "NewKey": NEW_KEY,
}
