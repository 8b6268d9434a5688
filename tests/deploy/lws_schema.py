"""A schema check for LeaderWorkerSet objects (leaderworkerset.x-k8s.io/v1).

kubernetes-validate knows only Kubernetes' own kinds, and an API server prunes the fields a
CRD does not define without a word, so a misspelt `restartPolicy` would deploy as the default
policy. This is the v1 API written out as JSON Schema, field by field, from the LWS API types
(kubernetes-sigs/lws, api/leaderworkerset/v1/leaderworkerset_types.go, read at v0.10.0 plus
11 commits, 2026-08), with the bounds its validating webhook adds (size >= 1, replicas <=
1,000,000). Every object refuses fields it does not define.

What the types borrow from Kubernetes is checked by Kubernetes' own schemas: the leader and
worker templates as core PodTemplateSpecs, the metadata as ObjectMeta, volumeClaimTemplates as
PersistentVolumeClaims, all through kubernetes-validate in strict mode.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import kubernetes_validate

API_VERSION = "leaderworkerset.x-k8s.io/v1"
INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
# intstr.IntOrString: a count, or a percentage such as "10%" (the webhook's rule).
INT_OR_PERCENT = {
    "anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": r"^[0-9]+%$"}]
}
CORE = {"type": "object"}  # a Kubernetes type: checked by kubernetes-validate (below)


def closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object with exactly these fields (the Go struct's json names)."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def enum(*values: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(values)}


ROLLING_UPDATE_CONFIGURATION = closed(
    {
        "partition": {**INT32, "minimum": 0},
        "maxUnavailable": INT_OR_PERCENT,
        "maxSurge": INT_OR_PERCENT,
    }
)
ROLLOUT_STRATEGY = closed(
    {"type": enum("RollingUpdate"), "rollingUpdateConfiguration": ROLLING_UPDATE_CONFIGURATION},
    required=("type",),
)
SUB_GROUP_POLICY = closed(
    {
        "subGroupPolicyType": enum("LeaderWorker", "LeaderExcluded"),
        "subGroupSize": {**INT32, "minimum": 1},
    }
)
PVC_RETENTION = closed(
    {"whenDeleted": enum("Retain", "Delete"), "whenScaled": enum("Retain", "Delete")}
)
LEADER_WORKER_TEMPLATE = closed(
    {
        "leaderTemplate": CORE,
        "workerTemplate": CORE,
        "size": {**INT32, "minimum": 1},
        # "Default" is the deprecated name of "None".
        "restartPolicy": enum(
            "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None", "Default"
        ),
        "subGroupPolicy": SUB_GROUP_POLICY,
        "volumeClaimTemplates": {"type": "array", "items": CORE},
        "persistentVolumeClaimRetentionPolicy": PVC_RETENTION,
    },
    required=("workerTemplate",),
)
NETWORK_CONFIG = closed(
    {"subdomainPolicy": enum("Shared", "UniquePerReplica")}, required=("subdomainPolicy",)
)
SPEC = closed(
    {
        "replicas": {**INT32, "minimum": 0, "maximum": 1_000_000},
        "leaderWorkerTemplate": LEADER_WORKER_TEMPLATE,
        "rolloutStrategy": ROLLOUT_STRATEGY,
        "startupPolicy": enum("LeaderCreated", "LeaderReady"),
        "networkConfig": NETWORK_CONFIG,
    },
    required=("leaderWorkerTemplate",),
)
LEADER_WORKER_SET = closed(
    {
        "apiVersion": {"const": API_VERSION},
        "kind": {"const": "LeaderWorkerSet"},
        "metadata": CORE,
        "spec": SPEC,
        "status": {"type": "object"},  # written by the controller; a manifest has none
    },
    required=("apiVersion", "kind", "metadata", "spec"),
)


def errors(lws: dict[str, Any], k8s_version: str) -> list[str]:
    """Every way `lws` departs from the v1 API, as `path: message` lines (none: valid)."""
    validator = jsonschema.Draft202012Validator(LEADER_WORKER_SET)
    found = [
        f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
        for e in validator.iter_errors(lws)
    ]
    if found:  # the borrowed parts' places are only known once the structure holds
        return found
    lwt = lws["spec"]["leaderWorkerTemplate"]
    # (where in the LWS, a core object holding that part, the part's key in the core object)
    borrowed: list[tuple[str, dict[str, Any], str]] = [
        ("metadata", _pod_template(lws["metadata"], {}), "metadata"),
    ]
    for name in ("leaderTemplate", "workerTemplate"):
        if name in lwt:
            core = _pod_template({}, lwt[name])
            borrowed.append((f"spec.leaderWorkerTemplate.{name}", core, "template"))
    for i, claim in enumerate(lwt.get("volumeClaimTemplates", [])):
        pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", **claim}
        borrowed.append((f"spec.leaderWorkerTemplate.volumeClaimTemplates.{i}", pvc, ""))
    for where, core, key in borrowed:
        try:
            kubernetes_validate.validate(core, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            inner = list(map(str, exc.absolute_path))
            if key and inner[:1] == [key]:
                inner = inner[1:]
            path = ".".join([where, *inner])
            found.append(f"{path}: {exc.message} (Kubernetes' {core['kind']} schema)")
    return found


def _pod_template(metadata: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    """A core PodTemplate holding `metadata` (checked as ObjectMeta) and `template` (as a
    PodTemplateSpec): the one core kind made of exactly those two types."""
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": metadata or {"name": "template"},
        "template": template,
    }
