"""Reading deploy/kubernetes as the cluster would: its YAML documents, the kustomization, and a
container's command line with its environment expanded the way the kubelet expands it.

LeaderWorkerSet's part is simulated from its source (kubernetes-sigs/lws): every container of
a group gets LWS_LEADER_ADDRESS = `<lws>-<group>.<subdomain>.<namespace>` (the subdomain is
the LeaderWorkerSet's name under the default, shared, subdomain policy), LWS_GROUP_SIZE = size
and LWS_WORKER_INDEX, put before the container's own variables; pods carry the labels
`leaderworkerset.sigs.k8s.io/{name,group-index,worker-index}`, and are named `<lws>-<group>`
(the leader) and `<lws>-<group>-<index>` (the workers).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from engine.flags import build_parser, place
from engine.settings import NodeSettings

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
LWS_KIND = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
LABEL = "leaderworkerset.sigs.k8s.io/"
# The oldest and the newest Kubernetes whose schemas kubernetes-validate carries (1.25 and
# 1.37 with kubernetes-validate 1.37): the manifests must hold for both.
K8S_VERSIONS = (kubernetes_validate.utils.all_versions()[0], kubernetes_validate.latest_version())

Doc = dict[str, Any]


def files() -> list[Path]:
    """Every manifest (the kustomization itself is kustomize's, not the cluster's)."""
    return sorted(p for p in KUBE.rglob("*.yaml") if p.name != "kustomization.yaml")


def documents(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def every_document() -> list[tuple[Path, Doc]]:
    return [(path, doc) for path in files() for doc in documents(path)]


def kustomization() -> Doc:
    loaded: Doc = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    return loaded


def deployed() -> list[Doc]:
    """What `kubectl apply -k deploy/kubernetes` applies: the kustomization's resources."""
    return [doc for name in kustomization()["resources"] for doc in documents(KUBE / name)]


def is_lws(doc: Doc) -> bool:
    return (doc.get("apiVersion"), doc.get("kind")) == LWS_KIND


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def gateway_toml(docs: list[Doc]) -> tuple[str, dict[str, Any]]:
    """The ConfigMap's config.toml: its text and its TOML."""
    text: str = one(docs, "ConfigMap", "unitgate-gateway-config")["data"]["config.toml"]
    return text, tomllib.loads(text)


@dataclass(frozen=True)
class Pod:
    """One pod of a LeaderWorkerSet group, as the controller and its webhook make it."""

    lws: Doc
    group: int
    index: int  # LWS_WORKER_INDEX: 0 is the leader

    @property
    def name(self) -> str:
        base = f"{self.lws['metadata']['name']}-{self.group}"
        return base if self.index == 0 else f"{base}-{self.index}"

    @property
    def template(self) -> Doc:
        lwt = self.lws["spec"]["leaderWorkerTemplate"]
        chosen: Doc = lwt.get("leaderTemplate") or lwt["workerTemplate"]
        return chosen if self.index == 0 else lwt["workerTemplate"]

    @property
    def container(self) -> Doc:
        containers = self.template["spec"]["containers"]
        assert len(containers) == 1, "one node per pod"
        node: Doc = containers[0]
        return node

    @property
    def namespace(self) -> str:
        ns: str = self.lws["metadata"]["namespace"]
        return ns

    @property
    def dns(self) -> str:
        """The pod's name through the group's headless service (shared subdomain policy)."""
        return f"{self.name}.{self.lws['metadata']['name']}.{self.namespace}.svc.cluster.local"

    def lws_env(self) -> dict[str, str]:
        name = self.lws["metadata"]["name"]
        return {
            "LWS_LEADER_ADDRESS": f"{name}-{self.group}.{name}.{self.namespace}",
            "LWS_GROUP_SIZE": str(self.lws["spec"]["leaderWorkerTemplate"].get("size", 1)),
            "LWS_WORKER_INDEX": str(self.index),
        }

    def field(self, path: str) -> str:
        """A downward-API fieldRef's value for this pod."""
        labels = {
            **self.template.get("metadata", {}).get("labels", {}),
            LABEL + "name": self.lws["metadata"]["name"],
            LABEL + "group-index": str(self.group),
            LABEL + "worker-index": str(self.index),
        }
        simple = {
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
            "status.podIP": f"10.0.{self.group}.{self.index + 1}",
        }
        if path in simple:
            return simple[path]
        match = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
        assert match and match[1] in labels, f"fieldRef {path!r}: not a label this pod has"
        return labels[match[1]]

    def env(self) -> dict[str, str]:
        """The container's environment: LWS's variables first, then its own, each value
        expanded against those before it (secrets stand in as placeholders)."""
        env = self.lws_env()
        for var in self.container.get("env", []):
            if "value" in var:
                env[var["name"]] = expand(var["value"], env)
            elif "fieldRef" in var.get("valueFrom", {}):
                env[var["name"]] = self.field(var["valueFrom"]["fieldRef"]["fieldPath"])
            else:
                env[var["name"]] = f"<{var['name']}>"
        return env

    def argv(self) -> list[str]:
        """The container's args as the kubelet passes them ($(VAR) expanded)."""
        env = self.env()
        return [expand(arg, env) for arg in self.container["args"]]


def settings_of(pod: Pod) -> NodeSettings:
    """What `unitgate node` makes of the pod's args and environment (its real parser)."""
    args = pod.argv()[1:]
    return NodeSettings.from_flags(place(build_parser().parse_args(args), args, pod.env()))


def pods(lws: Doc, group: int = 0) -> list[Pod]:
    size = lws["spec"]["leaderWorkerTemplate"].get("size", 1)
    return [Pod(lws, group, index) for index in range(size)]


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: a defined variable is replaced, `$$` is a literal `$`,
    and an undefined reference is left as it is."""

    def one_ref(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one_ref, text)
