"""The units' LeaderWorkerSets: valid against the LWS v1 API (tests/deploy/lws_schema.py), a
gang that restarts whole, probed on /health, and each pod's command line accepted by the real
`unitgate node` parser, with the placement LWS injects."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from engine.backends.vllm.args import parse_vllm_args
from tests.deploy import lws_schema
from tests.deploy.manifests import (
    K8S_VERSIONS,
    KUBE,
    Doc,
    every_document,
    is_lws,
    pods,
    settings_of,
)

UNITS = [(path, doc) for path, doc in every_document() if is_lws(doc)]
IDS = [f"{p.relative_to(KUBE)}:{d['metadata']['name']}" for p, d in UNITS]
# Stock vLLM with `unitgate watch` sidecars runs no `unitgate node`: test_watch_sidecar.py.
STOCK = "llama-stock"
NODES = [(p, d) for p, d in UNITS if d["metadata"]["name"] != STOCK]
NODE_IDS = [f"{p.relative_to(KUBE)}:{d['metadata']['name']}" for p, d in NODES]


def test_every_unit_manifest_is_found() -> None:
    names = {d["metadata"]["name"] for _, d in UNITS}
    assert names == {"smollm2", "llama-cuda", "llama-neuron", STOCK}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("path", "lws"), UNITS, ids=IDS)
def test_valid_against_the_lws_api(path: Path, lws: Doc, version: str) -> None:
    assert lws_schema.errors(lws, version) == []


def smollm2() -> Doc:
    """A copy of the CPU units' LeaderWorkerSet, to break."""
    return copy.deepcopy(next(d for _, d in UNITS if d["metadata"]["name"] == "smollm2"))


def errors(lws: Doc) -> list[str]:
    return lws_schema.errors(lws, K8S_VERSIONS[-1])


ROLLING = "spec.rolloutStrategy.rollingUpdateConfiguration"
LEADER = "spec.leaderWorkerTemplate.leaderTemplate"
WORKER = "spec.leaderWorkerTemplate.workerTemplate"


def misspell(lws: Doc, path: str, new_key: str) -> Doc:
    """A copy of `lws` with the field at dotted `path` renamed to `new_key`."""
    broken = copy.deepcopy(lws)
    *parents, key = path.split(".")
    node: Any = broken
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[new_key] = node.pop(key)
    return broken


@pytest.mark.parametrize(
    ("path", "typo", "where"),
    [
        ("spec.leaderWorkerTemplate", "leaderWorkerTemplates", "spec"),
        ("spec.leaderWorkerTemplate.restartPolicy", "restartPolicyy", "spec.leaderWorkerTemplate"),
        ("spec.leaderWorkerTemplate.size", "groupSize", "spec.leaderWorkerTemplate"),
        ("spec.startupPolicy", "startUpPolicy", "spec"),
        (f"{ROLLING}.maxSurge", "maxsurge", ROLLING),
        (f"{WORKER}.spec.containers.0.image", "imagee", f"{WORKER}.spec.containers.0"),
        (f"{LEADER}.spec.containers.0.args", "arg", f"{LEADER}.spec.containers.0"),
        (f"{LEADER}.spec.containers.0.readinessProbe", "readyProbe", f"{LEADER}.spec.containers.0"),
        ("metadata.name", "nmae", "metadata"),
    ],
)
def test_a_misspelt_field_fails(path: str, typo: str, where: str) -> None:
    found = errors(misspell(smollm2(), path, typo))
    assert found, f"{path} -> {typo} passed"
    assert any(typo in line for line in found), found
    assert any(line.startswith(where + ":") for line in found), found


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.leaderWorkerTemplate.restartPolicy", "RecreateGroupOnRestart"),
        ("spec.leaderWorkerTemplate.size", 0),
        ("spec.startupPolicy", "leaderReady"),
        ("spec.replicas", "2"),
        ("spec.rolloutStrategy.type", "Recreate"),
    ],
)
def test_a_bad_value_fails(path: str, value: object) -> None:
    lws = smollm2()
    *parents, key = path.split(".")
    node: Any = lws
    for part in parents:
        node = node[part]
    node[key] = value
    assert errors(lws), f"{path} = {value!r} passed"


def test_a_missing_required_field_fails() -> None:
    lws = smollm2()
    del lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert any("'workerTemplate' is a required" in e for e in errors(lws))
    lws = smollm2()
    lws["spec"]["networkConfig"] = {}
    assert any("'subdomainPolicy' is a required" in e for e in errors(lws))


@pytest.mark.parametrize(("path", "lws"), UNITS, ids=IDS)
def test_a_unit_is_a_gang_restarted_whole(path: Path, lws: Doc) -> None:
    spec = lws["spec"]
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert spec["leaderWorkerTemplate"]["size"] >= 2
    # A leader answers /health only once its workers joined: LeaderReady would never start them.
    assert spec.get("startupPolicy", "LeaderCreated") == "LeaderCreated"
    assert "networkConfig" not in spec  # the shared subdomain the gateway's URLs are built on


@pytest.mark.parametrize(("path", "lws"), NODES, ids=NODE_IDS)
def test_every_pod_runs_unitgate_node_placed_by_lws(path: Path, lws: Doc) -> None:
    roles = []
    for pod in pods(lws):
        argv = pod.argv()
        assert argv[0] == "node"
        settings = settings_of(pod)
        roles.append(settings.role)
        assert argv[argv.index("--role") + 1] == settings.role  # given, and agreeing
        for flag in ("--rank", "--world-size", "--master"):
            assert flag not in argv, f"{flag}: LWS's variables give it"
        assert (settings.rank, settings.world_size) == (pod.index, len(pods(lws)))
        name = lws["metadata"]["name"]
        assert settings.master == f"{name}-0.{name}.unitgate:29500"  # LWS_LEADER_ADDRESS
        assert settings.unit == f"{name}-0"  # the leader pod's name
        if settings.backend == "vllm":
            parse_vllm_args(settings.vllm_args)  # valid JSON, no key unitgate sets itself
    assert roles == ["leader"] + ["follower"] * (len(roles) - 1)


@pytest.mark.parametrize(("path", "lws"), NODES, ids=NODE_IDS)
def test_probes_are_the_nodes_health_port(path: Path, lws: Doc) -> None:
    for pod in pods(lws):
        settings = settings_of(pod)
        container = pod.container
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert settings.health_host == "0.0.0.0"
        assert ports["health"] == settings.health_port
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = container[probe]["httpGet"]
            assert (get["path"], get["port"]) == ("/health", "health"), probe
        if settings.is_leader:
            assert (settings.host, ports["api"]) == ("0.0.0.0", settings.port)
            assert ports["rendezvous"] == settings.master_addr[1]


def test_the_vllm_examples_ask_for_their_accelerators() -> None:
    wanted = {"llama-cuda": "nvidia.com/gpu", "llama-neuron": "aws.amazon.com/neuron"}
    for _, lws in NODES:
        name = lws["metadata"]["name"]
        for pod in pods(lws):
            limits = pod.container["resources"]["limits"]
            if name in wanted:
                assert int(limits[wanted[name]]) > 0
                assert settings_of(pod).backend == "vllm"
            else:
                assert settings_of(pod).backend == "builtin"
                assert not {"nvidia.com/gpu", "aws.amazon.com/neuron"} & set(limits)
