"""Kubernetes' own kinds in deploy/kubernetes, against Kubernetes' schemas (kubernetes-validate,
strict: an unknown field fails, as `kubectl apply` with server-side field validation refuses
it), at the oldest and the newest Kubernetes the package carries schemas for; and the
kustomization, which must apply exactly these files."""

from __future__ import annotations

import copy
import shutil
import socket
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from packaging.version import Version

from tests.deploy.manifests import (
    K8S_VERSIONS,
    KUBE,
    ROOT,
    Doc,
    documents,
    every_document,
    files,
    is_lws,
)
from tests.deploy.manifests import kustomization as read_kustomization

CORE = [(path, doc) for path, doc in every_document() if not is_lws(doc)]
IDS = [f"{p.relative_to(KUBE)}:{d['kind']}/{d['metadata']['name']}" for p, d in CORE]


def test_the_schemas_are_packaged_not_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    """kubernetes-validate reads its schemas from the wheel: it validates with no network."""

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("kubernetes-validate tried the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(CORE[0][1], version, strict=True)
    assert Version(K8S_VERSIONS[0]) < Version("1.32") <= Version(K8S_VERSIONS[1])


def test_the_manifests_hold_these_kinds() -> None:
    kinds = {d["kind"] for _, d in CORE}
    assert kinds == {
        "Namespace",
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    }


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("path", "doc"), CORE, ids=IDS)
def test_valid_against_the_kubernetes_schema(path: Path, doc: Doc, version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_catches_a_misspelt_field() -> None:
    deployment = next(d for _, d in CORE if d["kind"] == "Deployment")
    broken = copy.deepcopy(deployment)
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def test_every_object_is_in_the_unitgate_namespace() -> None:
    for path, doc in every_document():
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "unitgate", path


def test_the_kustomization_lists_every_file_but_the_secret_and_the_examples() -> None:
    listed = {KUBE / name for name in read_kustomization()["resources"]}
    assert listed <= set(files())
    left_out = {p.relative_to(KUBE).as_posix() for p in set(files()) - listed}
    assert left_out == {
        "secret.example.yaml",
        "units/vllm-cuda.yaml",
        "units/vllm-neuron.yaml",
        "units/vllm-stock.yaml",
    }


def test_kustomize_builds_exactly_the_listed_objects() -> None:
    assert shutil.which("kubectl"), "kubectl is missing (make test installs kubernetes-client)"
    built = subprocess.run(
        ["kubectl", "kustomize", str(KUBE)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert built.returncode == 0, built.stderr
    got = sorted(key(d) for d in yaml.safe_load_all(built.stdout) if d)
    want = sorted(
        key(d) for name in read_kustomization()["resources"] for d in documents(KUBE / name)
    )
    assert got == want


def key(doc: Doc) -> tuple[str, str, str]:
    return (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
