"""Package boundaries the design promises, checked on the import graph.

The request path (gateway/proxy/) emits signals and its observers do the metrics and the
tracing: if a proxy module reached prometheus_client or opentelemetry, even through another
project module, observability would be back inside the path. `unitgate up` (gateway/launcher/up/)
hosts a gateway through its public entry points only (gateway/api.py), so the gateway's
internals can move without breaking it. Gateway and engine stand side by side on one base
(gateway/base/): the engine takes nothing else of the gateway, and the base takes nothing of
the project.
"""

from __future__ import annotations

from tests.architecture.imports import external, imported, modules

OBSERVABILITY_LIBRARIES = {"prometheus_client", "opentelemetry"}


def reachable(start: str, graph: dict[str, set[str]]) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    known = modules()
    edges = {name: set(imported(path, name, known)) for name, path in known.items()}
    outside = {name: external(path) for name, path in known.items()}
    return edges, outside


def test_the_request_path_reaches_no_metrics_or_tracing_library() -> None:
    edges, outside = graph()
    offenders = {}
    for name in edges:
        if name.startswith("gateway.proxy."):
            for module in reachable(name, edges):
                hit = outside[module] & OBSERVABILITY_LIBRARIES
                if hit:
                    offenders[name] = (module, sorted(hit))
    assert offenders == {}


def test_health_reaches_no_observability_module() -> None:
    """Health emits signals and the metrics and events log subscribe, as on the request path:
    no health module reaches gateway/observability/, a metrics library or a tracing one (the
    vLLM kind reads vLLM's /metrics with prometheus_client's text parser, which is no export)."""
    edges, outside = graph()
    offenders = {}
    for name in edges:
        if name.startswith("gateway.health."):
            for module in reachable(name, edges):
                hit = set(outside[module] & OBSERVABILITY_LIBRARIES)
                if module == "gateway.health.kinds.vllm_metrics":
                    hit.discard("prometheus_client")
                if module.startswith("gateway.observability"):
                    hit.add(module)
                if hit:
                    offenders[name] = (module, sorted(hit))
    assert offenders == {}


def test_the_checker_sees_a_transitive_import() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": set(), "d": set()}
    assert reachable("a", edges) == {"a", "b", "c"}


def test_unitgate_up_uses_only_the_gateways_public_api() -> None:
    edges, _ = graph()
    used = {
        target
        for name, targets in edges.items()
        if name.startswith("gateway.launcher.up")
        for target in targets
        if target.startswith("gateway") and not target.startswith("gateway.launcher")
    }
    assert used <= {"gateway.api"} | BASE, used


def test_the_floors_launcher_on_top_gateway_and_engine_side_by_side() -> None:
    """No product module imports the launcher (`python -m gateway`, its entry, aside), and
    the gateway below it imports nothing of the engine."""
    edges, _ = graph()
    up = {
        (name, target)
        for name, targets in edges.items()
        if name.startswith(("gateway.", "engine."))
        and not name.startswith("gateway.launcher")
        and name != "gateway.__main__"
        for target in targets
        if target.startswith("gateway.launcher")
    }
    assert up == set(), sorted(up)
    across = {
        (name, target)
        for name, targets in edges.items()
        if name.startswith("gateway.") and not name.startswith("gateway.launcher")
        for target in targets
        if target.startswith("engine")
    }
    assert across == set(), sorted(across)


BASE = {
    "gateway.base",
    "gateway.base.cbuild",
    "gateway.base.chat_template",
    "gateway.base.loop",
    "gateway.base.lws",
    "gateway.base.net",
    "gateway.base.oslimits",
    "gateway.base.ports",
    "gateway.base.readyfile",
    "gateway.base.tasks",
}


def test_the_base_stands_on_nothing_of_the_project() -> None:
    edges, _ = graph()
    assert set(edges) >= BASE, sorted(BASE - set(edges))  # the list above is the package
    assert {n for n in edges if n.startswith("gateway.base")} == BASE
    project = ("gateway", "engine", "loadtest", "tests")
    assert {n: sorted(t for t in edges[n] if t.startswith(project)) for n in BASE} == {
        n: [] for n in BASE
    }


def test_the_engine_takes_only_the_base_of_the_gateway() -> None:
    """Its launcher (gateway/launcher/up/, which starts gateways too) aside."""
    edges, _ = graph()
    used = {
        (name, target)
        for name, targets in edges.items()
        if name.startswith("engine.") and not name.startswith("gateway.launcher.up")
        for target in targets
        if target.startswith("gateway") and target not in BASE
    }
    assert used == set(), sorted(used)


def test_the_load_tools_stand_apart_from_the_gateway() -> None:
    """The load generator and the simulated units run in front of any OpenAI server: from the
    gateway they take only its standard-library-only base."""
    edges, _ = graph()
    used = {
        target
        for name, targets in edges.items()
        if name.startswith(("loadtest.gen", "loadtest.simunits"))
        for target in targets
        if target.startswith("gateway")
    }
    assert used <= BASE, used


# The gateway's floors, top to bottom: a package imports its own floor's other packages only
# where SIDEWAYS allows it, and any package of a floor below. (The base, gateway/base/, is
# below them all and stands on nothing: test_the_base_stands_on_nothing_of_the_project.)
FLOORS: tuple[tuple[str, ...], ...] = (
    ("launcher", "__main__"),  # unitgate, unitgate up: starts gateways, engines, redis
    ("api", "server", "workers", "app", "check_config", "watch"),  # hosting a gateway
    ("knowledge",),  # what routing learns of the units: caches, speed, conversations' turns
    ("admin", "status"),  # the operator's surfaces
    ("rollout",),  # a revision replaced by another, cell by cell, judged by gates
    ("observability",),  # metrics, traces, logs, events: subscribers
    ("front",),  # the public listener's lean protocol
    ("proxy",),  # the request path
    ("health",),  # probers, breakers, verdicts: an observer of the path's signals
    ("signals",),  # the request path's signals, which health and observability subscribe to
    ("units",),  # the fleet's registry
    # policies; the raw client to units, and the relay of their answers' bytes to the client,
    # read by read, in C (relay/native/) or in Python
    # and what each unit's KV cache holds, from its engine's events
    ("routing", "limits", "auth", "upstream", "relay", "kvevents"),
    ("errors", "paths", "shares", "heap", "cors", "tls", "version", "revisions"),
    ("config", "outcomes"),
    ("health_states",),  # a unit's health values
    ("envchoice",),
)
SIDEWAYS = {
    ("__main__", "launcher"),  # python -m gateway is the unitgate command
    ("api", "server"),  # the public entry point over the server
    ("api", "workers"),
    ("workers", "server"),  # a worker hosts a server
    ("server", "app"),  # the server builds the public app
    ("admin", "status"),  # the admin API serves the status page; the page checks its token
    ("status", "admin"),
    ("auth", "limits"),  # a key carries its limits
    ("relay", "upstream"),  # the relay reads from a unit's connection ...
    ("upstream", "relay"),  # ... whose protocol is the native relay's Tap (types only)
}


def floor_of(package: str) -> int:
    for at, names in enumerate(FLOORS):
        if package in names:
            return at
    raise AssertionError(f"gateway.{package} is on no floor: add it to FLOORS")


def test_every_arrow_between_the_gateways_packages_points_down() -> None:
    edges, _ = graph()
    upward = set()
    for name, targets in edges.items():
        parts = name.split(".")
        if parts[0] != "gateway" or len(parts) < 2 or parts[1] == "base":
            continue
        for target in targets:
            tparts = target.split(".")
            if tparts[0] != "gateway" or len(tparts) < 2 or tparts[1] in ("base", parts[1]):
                continue
            a, b = parts[1], tparts[1]
            if floor_of(b) < floor_of(a) or (floor_of(b) == floor_of(a) and (a, b) not in SIDEWAYS):
                upward.add((name, target))
    assert upward == set(), sorted(upward)


def test_health_and_the_upstream_client_import_nothing_of_the_proxy() -> None:
    edges, _ = graph()
    offenders = {
        (name, module)
        for name in edges
        if name.startswith(("gateway.health.", "gateway.upstream.", "gateway.signals"))
        for module in reachable(name, edges)
        if module.startswith(("gateway.proxy", "gateway.observability"))
    }
    assert offenders == set(), sorted(offenders)
