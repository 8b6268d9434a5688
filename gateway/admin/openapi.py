"""The admin API described as an OpenAPI 3.1 document, served at GET /admin/openapi.json.

The document needs no token: it says what the API does, never anything about the fleet, and
tools (code generators, API browsers) fetch it before they hold one. It is built once, from
the schemas in gateway/admin/schemas.py; tests/gateway/admin/test_admin_openapi.py checks it against
the routes the admin app registers and validates the real handlers' answers with it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import orjson
from aiohttp import web

from gateway.admin import key_schemas, rollout_schemas
from gateway.admin.schemas import SCHEMAS, Schema, of, ref
from gateway.version import version

PATH = "/openapi.json"  # inside the admin app, which is mounted at /admin/
ROUTE = "openapi"  # the route's name: the admin's auth middleware lets it through

INTRO = """\
Look at units, take them out of service and back, add and remove them, read the events log,
make and revoke the data plane's API keys, roll a new revision out cell by cell.

Served on the operator listener (next to /metrics) under /admin/, when `[admin].enabled`.
Every operation but this document's needs `Authorization: Bearer <token>`: no or malformed
header is 401, a wrong token 403. Bodies and answers are JSON; errors have the OpenAI API's
shape. Actions survive a restart when `[admin].state_file` is set (or with shared state)."""

ERRORS = {
    "400": "Bad body or query; the message names the key.",
    "401": "No `Authorization: Bearer` header.",
    "403": "The token is not valid.",
    "404": "No unit (or key) with this id, or no rollout.",
    "409": "A unit with this id exists, or a rollout is running.",
    "500": "The state file could not be written: the action was not applied.",
    "503": "The shared state store (or the replica driving the rollout) did not answer.",
}
AUTH = ("401", "403")
WRITE = (*AUTH, "500", "503")
UNIT_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "The unit's id.",
    "schema": of("string"),
}


def answer(description: str, schema: Schema) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def operation(
    summary: str,
    ok: tuple[str, str, Schema],
    errors: tuple[str, ...],
    *,
    about: str = "",
    tag: str = "units",
    **more: Any,
) -> dict[str, Any]:
    status, description, schema = ok
    responses = {status: answer(description, schema)}
    responses.update({code: {"$ref": f"#/components/responses/{code}"} for code in errors})
    found = {"summary": summary, "tags": [tag], "responses": responses, **more}
    if about:
        found["description"] = about
    return found


def reason_body(required: bool) -> dict[str, Any]:
    said = "required" if required else "optional; the body may be left out"
    return {
        "required": required,
        "description": f"Why ({said}): the events log records it with the token's name.",
        "content": {"application/json": {"schema": ref("Reason")}},
    }


def state_change(verb: str, about: str, required: bool) -> dict[str, Any]:
    return {
        "post": operation(
            f"{verb} a unit",
            ("200", "The unit after the change.", ref("Unit")),
            ("400", *WRITE, "404"),
            about=about,
            operationId=f"{verb.lower()}Unit",
            parameters=[UNIT_ID],
            requestBody=reason_body(required),
        )
    }


def paths() -> dict[str, Any]:
    return {
        "/admin/units": {
            "get": operation(
                "List the units",
                ("200", "Every unit, and the models in panic routing.", ref("UnitList")),
                AUTH,
                operationId="listUnits",
            ),
            "post": operation(
                "Add a unit",
                ("201", "The unit added.", ref("Unit")),
                ("400", *WRITE, "409"),
                about="It is not routable until its probes pass.",
                operationId="addUnit",
                requestBody={
                    "required": True,
                    "content": {"application/json": {"schema": ref("NewUnit")}},
                },
            ),
        },
        "/admin/units/{id}": {
            "get": operation(
                "Show a unit",
                ("200", "The unit.", ref("Unit")),
                (*AUTH, "404"),
                operationId="getUnit",
                parameters=[UNIT_ID],
            ),
            "delete": operation(
                "Remove a unit",
                ("200", "Removed; its requests in flight finish.", ref("Removed")),
                (*WRITE, "404"),
                operationId="removeUnit",
                parameters=[UNIT_ID],
            ),
        },
        "/admin/units/{id}/disable": state_change(
            "Disable",
            "No new requests; those in flight, streams included, run to their end.",
            required=True,
        ),
        "/admin/units/{id}/drain": state_change(
            "Drain",
            "As disable, but reported as `draining` until nothing is in flight, then "
            "`drained` (`drained: true`): poll the unit until then before taking it down.",
            required=False,
        ),
        "/admin/units/{id}/enable": state_change(
            "Enable",
            "The admin lets it serve again; it is routable once probes and breaker agree.",
            required=False,
        ),
        "/admin/events": {"get": events()},
        **key_paths(),
        **rollout_schemas.rollout_paths(operation, AUTH, WRITE),
        "/admin/workers": {
            "get": operation(
                "List the worker processes",
                ("200", "Each worker ([gateway].workers > 1).", ref("Workers")),
                AUTH,
                tag="gateway",
                operationId="listWorkers",
            )
        },
        "/admin/openapi.json": {
            "get": operation(
                "This document",
                ("200", "The admin API in OpenAPI 3.1.", ref("OpenApi")),
                (),
                tag="gateway",
                operationId="getOpenApi",
                security=[],
            )
        },
    }


def key_paths() -> dict[str, Any]:
    key_id = {**UNIT_ID, "description": "The key's id (key_...)."}
    return {
        "/admin/keys": {
            "get": operation(
                "List the API keys",
                ("200", "Every key, revoked and expired ones too; never a secret.", ref("KeyList")),
                AUTH,
                tag="keys",
                operationId="listKeys",
            ),
            "post": operation(
                "Make an API key",
                ("201", "The key, with its secret: shown this once.", ref("CreatedKey")),
                ("400", *WRITE),
                about="Data-plane requests send it as `Authorization: Bearer <key>`.",
                tag="keys",
                operationId="createKey",
                requestBody={
                    "required": True,
                    "content": {"application/json": {"schema": ref("NewKey")}},
                },
            ),
        },
        "/admin/keys/{id}": {
            "delete": operation(
                "Revoke an API key",
                ("200", "The key, revoked (revoking it again changes nothing).", ref("Key")),
                (*WRITE, "404"),
                about="Every replica refuses it within 100 ms.",
                tag="keys",
                operationId="revokeKey",
                parameters=[key_id],
            )
        },
    }


def events() -> dict[str, Any]:
    query = [
        {
            "name": "limit",
            "in": "query",
            "description": "The most recent N events.",
            "schema": of("integer", minimum=1, default=100),
        },
        {
            "name": "unit",
            "in": "query",
            "description": "Only this unit's events.",
            "schema": of("string"),
        },
    ]
    return operation(
        "Read the events log",
        ("200", "Admin actions and health and breaker changes.", ref("Events")),
        ("400", *AUTH),
        tag="events",
        operationId="listEvents",
        parameters=query,
    )


def document() -> dict[str, Any]:
    error = ref("Error")
    responses: dict[str, Any] = {code: answer(text, error) for code, text in ERRORS.items()}
    responses["401"]["headers"] = {
        "WWW-Authenticate": {"schema": of("string"), "description": "`Bearer realm=...`"}
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "unitgate admin API",
            "version": version(),
            "description": INTRO,
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "servers": [{"url": "/", "description": "The operator listener ([metrics] host, port)"}],
        "security": [{"bearer": []}],
        "tags": [
            {"name": "units", "description": "Units and their service state."},
            {"name": "events", "description": "Who changed what, and why."},
            {"name": "keys", "description": "The data plane's API keys."},
            {"name": "rollouts", "description": "A revision replaced by another, cell by cell."},
            {"name": "gateway", "description": "The gateway itself."},
        ],
        "paths": paths(),
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token from [admin].token_env or [admin].token_file.",
                }
            },
            "schemas": {**SCHEMAS, **key_schemas.SCHEMAS, **rollout_schemas.SCHEMAS},
            "responses": responses,
        },
    }


@cache
def rendered() -> bytes:
    return orjson.dumps(document())


async def serve(_: web.Request) -> web.Response:
    return web.Response(body=rendered(), content_type="application/json")


def route() -> web.RouteDef:
    return web.get(PATH, serve, name=ROUTE)
