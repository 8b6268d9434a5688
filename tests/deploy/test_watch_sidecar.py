"""The stock-vLLM example (deploy/kubernetes/units/vllm-stock.yaml): `vllm serve` as the
leader, `vllm serve --headless` as the follower with a `unitgate watch` sidecar in its pod.
Each command line is read as the kubelet expands it (LWS's variables included), the sidecar's
by the real `unitgate watch` parser and placement, and the header's [[units]] entry by the
gateway's own config loader. (Its schema, gang and security checks are the other units'.)"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass

import pytest

from gateway.config import config_from_dict
from gateway.watch.cli import build_parser
from gateway.watch.placement import Identity, identify
from tests.deploy.manifests import KUBE, Doc, Pod, documents, is_lws

PATH = KUBE / "units" / "vllm-stock.yaml"
(LWS,) = [d for d in documents(PATH) if is_lws(d)]
NAME = LWS["metadata"]["name"]
SIZE = LWS["spec"]["leaderWorkerTemplate"]["size"]


@dataclass(frozen=True)
class In(Pod):
    """One named container of a group's pod (Pod itself expects one container per pod)."""

    which: str = "vllm"

    @property
    def container(self) -> Doc:
        found: list[Doc] = [
            c for c in self.template["spec"]["containers"] if c["name"] == self.which
        ]
        assert len(found) == 1, f"{self.name}: {len(found)} containers named {self.which!r}"
        return found[0]

    def command_line(self) -> list[str]:
        return [*self.container.get("command", []), *self.argv()]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("group", [0, 3])
def test_vllm_runs_one_node_per_pod_placed_by_lws(group: int) -> None:
    for index in range(SIZE):
        argv = In(LWS, group, index).command_line()
        assert argv[:3] == ["vllm", "serve", "/models/llama-3.1-405b-instruct-fp8"]
        assert ("--headless" in argv) is (index > 0)
        assert flag(argv, "--nnodes") == str(SIZE)
        assert flag(argv, "--node-rank") == str(index)
        assert flag(argv, "--master-addr") == f"{NAME}-{group}.{NAME}.unitgate"
        assert flag(argv, "--distributed-executor-backend") == "mp"
        gpus = int(In(LWS, group, index).container["resources"]["limits"]["nvidia.com/gpu"])
        assert int(flag(argv, "--tensor-parallel-size")) == gpus * SIZE


def test_only_the_follower_pods_have_a_sidecar_sharing_their_process_namespace() -> None:
    leader, worker = (In(LWS, 0, 0).template["spec"], In(LWS, 0, 1).template["spec"])
    assert [c["name"] for c in leader["containers"]] == ["vllm"]
    assert [c["name"] for c in worker["containers"]] == ["vllm", "watch"]
    assert worker["shareProcessNamespace"] is True
    assert "shareProcessNamespace" not in leader
    sidecar = In(LWS, 0, 1, "watch").container
    assert sidecar["image"].startswith("unitgate:")
    assert "nvidia.com/gpu" not in sidecar["resources"].get("limits", {})


@pytest.mark.parametrize(("group", "index"), [(0, 1), (2, 1)])
def test_the_sidecar_watches_vllm_as_its_pods_node(group: int, index: int) -> None:
    """Parsed by `unitgate watch`'s own parser, placed from the pod's environment, and its
    pattern matches the vLLM container's command line."""
    pod = In(LWS, group, index, "watch")
    argv = pod.argv()
    assert argv[0] == "watch"
    ns = build_parser().parse_args(argv[1:])
    identity = identify(ns.unit, ns.rank, ns.from_env, pod.env())
    assert identity == Identity(f"{NAME}-{group}", index)  # the leader pod's name, its rank
    vllm = " ".join(In(LWS, group, index).command_line())
    assert re.search(ns.match, vllm)
    assert (ns.host, ns.pid, ns.pidfile) == ("0.0.0.0", None, None)
    ports = {p["name"]: p["containerPort"] for p in pod.container["ports"]}
    assert ports == {"health": ns.port}
    get = pod.container["readinessProbe"]["httpGet"]
    assert (get["path"], get["port"]) == ("/health", "health")
    assert "livenessProbe" not in pod.container  # restarting it would not revive vLLM


def test_the_header_says_how_the_gateway_lists_it() -> None:
    header = PATH.read_text().split("\napiVersion:", 1)[0]
    lines = [line.removeprefix("#").removeprefix(" ") for line in header.splitlines()]
    snippet = "\n".join(lines[lines.index("  [[units]]") :]).split("\n\n", 1)[0]
    model = re.search(r'with "([^"]+)" in \[gateway\]\.models', header)
    assert model, "the header names the model to add to [gateway].models"
    unit = config_from_dict({"gateway": {"models": [model[1]]}, **tomllib.loads(snippet)}).units[0]
    leader, follower = In(LWS, 0, 0), In(LWS, 0, 1, "watch")
    assert unit.kind == "vllm"
    assert unit.id == leader.name == f"{NAME}-0"
    api = flag(leader.argv(), "--port")
    assert unit.leader == unit.nodes[0] == f"http://{leader.dns}:{api}"
    health = flag(follower.argv(), "--port")
    assert unit.nodes[1:] == (f"http://{follower.dns}:{health}",)
    assert flag(leader.argv(), "--served-model-name") == model[1]
