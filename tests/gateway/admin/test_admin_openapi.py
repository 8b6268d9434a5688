"""The admin API's OpenAPI document: well-formed, its schemas valid JSON Schema, and its paths
the very routes the operator listener serves under /admin/. Its answers are checked against
real handlers in tests/integration/test_admin_openapi.py."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from typing import Any

import orjson
from aiohttp import web
from jsonschema import Draft202012Validator
from openapi_spec_validator import OpenAPIV31SpecValidator

from gateway.admin import openapi
from gateway.app import ops_app
from gateway.config import UnitConfig, config_from_dict
from gateway.observability.fleet import Fleet
from gateway.rollout.spec import FIELDS
from gateway.server import Gateway
from gateway.workers.pool import WorkerPool
from gateway.workers.reports import Reports

DOC = openapi.document()
METHODS = {"get", "put", "post", "delete", "patch", "options", "head", "trace"}


def operations(doc: dict[str, Any]) -> set[tuple[str, str]]:
    """(METHOD, path) of every documented operation."""
    return {
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method in item
        if method in METHODS
    }


def refs(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def pointed(doc: dict[str, Any], ref: str) -> object:
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def test_it_is_an_openapi_3_1_document() -> None:
    assert orjson.loads(openapi.rendered()) == DOC  # what is served is plain JSON
    assert re.fullmatch(r"3\.1\.\d+", DOC["openapi"])
    assert DOC["info"]["title"] and DOC["info"]["version"]
    assert DOC["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": DOC["components"]["securitySchemes"]["bearer"]["description"],
    }
    assert DOC["security"] == [{"bearer": []}]
    ids = []
    for method, path in operations(DOC):
        op = DOC["paths"][path][method.lower()]
        assert op["summary"] and op["responses"], (method, path)
        ids.append(op["operationId"])
        declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
        assert declared == set(re.findall(r"\{(\w+)\}", path)), (method, path)
        success = [status for status in op["responses"] if status.startswith("2")]
        assert len(success) == 1, (method, path)
    assert len(ids) == len(set(ids)), "operationIds are unique"


def test_it_meets_the_openapi_3_1_schema() -> None:
    """openapi-spec-validator: the OpenAPI Initiative's schema of 3.1 documents, and the
    checks a schema alone cannot make (references resolve, path parameters are declared)."""
    validator = OpenAPIV31SpecValidator(DOC)
    assert [error.message for error in validator.iter_errors()] == []
    broken = orjson.loads(openapi.rendered())
    broken["paths"]["/admin/units"]["get"]["responses"]["200"]["contents"] = {}
    errors = list(OpenAPIV31SpecValidator(broken).iter_errors())
    assert errors, "the validator is strict enough to catch a typo"


def test_every_schema_is_valid_json_schema_and_every_ref_resolves() -> None:
    for name, schema in DOC["components"]["schemas"].items():
        Draft202012Validator.check_schema(schema)  # raises SchemaError, naming the part
        assert schema.get("description") or schema.get("properties"), name
    for ref in refs(DOC):
        assert pointed(DOC, ref) is not None, ref
    # Every error answer is the Error schema, the OpenAI API's shape.
    for status, response in DOC["components"]["responses"].items():
        assert int(status) >= 400
        assert response["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"
        }


def test_every_component_is_used() -> None:
    used = set(refs(DOC))
    for kind in ("schemas", "responses"):
        for name in DOC["components"][kind]:
            assert f"#/components/{kind}/{name}" in used, name


async def test_the_document_lists_exactly_the_routes_served_under_admin() -> None:
    """The operator listener's app as the gateway builds it: its /admin/ routes (HEAD
    aside, aiohttp adds it to every GET) are the document's operations, no more, no less."""
    config = config_from_dict(
        {
            "gateway": {"models": ["m"]},
            "admin": {"enabled": True},
            "units": [{"id": "u0", "leader": "http://127.0.0.1:9"}],
        }
    )
    gw = Gateway(config)
    assert gw.admin is not None
    app = ops_app(gw.metrics, gw.admin.app(), gw.admin.status)
    served = {
        (route.method, route.resource.canonical)
        for route in routes(app)
        if route.resource is not None
        and route.resource.canonical.startswith("/admin/")
        and route.method != "HEAD"
    }
    assert served, "no admin route found: the app's layout changed"
    assert served == operations(DOC)


def routes(app: web.Application) -> Iterator[web.AbstractRoute]:
    """Every route of `app` and of the sub-applications mounted in it."""
    for resource in app.router.resources():
        mounted = getattr(resource, "_app", None)  # a sub-application's resource
        if isinstance(mounted, web.Application):
            yield from routes(mounted)
        else:
            yield from resource


def test_a_new_unit_body_has_every_unit_config_key() -> None:
    """POST /admin/units takes a [[units]] table: a key added to UnitConfig must be documented."""
    schema = DOC["components"]["schemas"]["NewUnit"]
    fields = dataclasses.fields(UnitConfig)
    assert set(schema["properties"]) == {f.name for f in fields}
    missing = dataclasses.MISSING
    required = {f.name for f in fields if f.default is missing and f.default_factory is missing}
    assert set(schema["required"]) == required
    assert schema["additionalProperties"] is False  # unknown keys are refused with a 400


def test_a_rollout_body_has_every_field_the_rollout_reads() -> None:
    """POST /admin/rollouts refuses unknown fields by name: the schema lists exactly those."""
    schemas = DOC["components"]["schemas"]
    assert set(schemas["NewRollout"]["properties"]) == FIELDS
    assert set(schemas["RolloutSpec"]["properties"]) == FIELDS
    assert schemas["NewRollout"]["required"] == ["to"]


def test_only_the_document_goes_without_a_token() -> None:
    public = {op for op in operations(DOC) if pointed_op(op).get("security") == []}
    assert public == {("GET", "/admin/openapi.json")}
    for op in operations(DOC) - public:
        assert {"401", "403"} <= set(pointed_op(op)["responses"]), op


def pointed_op(op: tuple[str, str]) -> dict[str, Any]:
    method, path = op
    found: dict[str, Any] = DOC["paths"][path][method.lower()]
    return found


async def test_a_worker_pools_view_is_a_documented_workers_answer() -> None:
    """/admin/workers is empty in one process (tests/integration checks that answer); here a
    pool's own view, one worker up and one restarting, against the same schema."""
    config = config_from_dict({"gateway": {"models": ["m"]}, "units": []})
    pool = WorkerPool(config, Reports(), Fleet(), 2)
    up = pool.workers[0]
    up.pid, up.started, up.applied = 4242, time.monotonic() - 3.0, 7
    up.propagation.extend([0.001, 0.004])
    answer = {"workers": pool.view()}
    assert answer["workers"][1]["pid"] is None
    # The refs point into the document: validate from a root that carries its components.
    root = {"$ref": "#/components/schemas/Workers", "components": DOC["components"]}
    validator = Draft202012Validator(root)
    errors = [error.message for error in validator.iter_errors(answer)]
    assert errors == []
    assert list(validator.iter_errors({"workers": [{**answer["workers"][0], "x": 1}]}))
