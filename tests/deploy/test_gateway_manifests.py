"""The gateway's manifests: its config.toml loaded by the gateway's own validator, each unit in
it matching the LeaderWorkerSet group that runs it, and the Deployment, Services, Secret and
PodDisruptionBudget agreeing with the config and with each other."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gateway.config import Config, config_from_dict, load_config
from tests.deploy.manifests import (
    KUBE,
    Doc,
    deployed,
    documents,
    every_document,
    gateway_toml,
    is_lws,
    one,
    pods,
    settings_of,
)

DOCS = deployed()


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    """Loaded as the pods load it: from a file, by `load_config`."""
    text, _ = gateway_toml(DOCS)
    path = tmp_path_factory.mktemp("configmap") / "config.toml"
    path.write_text(text)
    return load_config(path)


def gateway_container() -> Doc:
    deployment = one(DOCS, "Deployment", "unitgate-gateway")
    container: Doc = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def test_the_config_is_valid_and_shares_state_through_redis(config: Config) -> None:
    assert config.state.backend == "redis"
    assert config.state.replica == ""  # each replica is named by its pod's hostname
    assert config.admin.state_file == ""
    assert not config.admin.allow_unauthenticated_loopback
    assert (config.gateway.host, config.metrics.host) == ("0.0.0.0", "0.0.0.0")
    assert config.gateway.worker_count == 1  # replicas scale it here, not workers


def test_each_unit_is_a_leaderworkerset_group(config: Config) -> None:
    """Unit ids, leader and node URLs are exactly what the deployed groups' pods are named,
    report and listen on; every group is listed once."""
    want = {}
    for lws in (d for d in DOCS if is_lws(d)):
        for group in range(lws["spec"]["replicas"]):
            members = pods(lws, group)
            settings = [settings_of(pod) for pod in members]
            leader = settings[0]
            unit = leader.unit
            assert {s.unit for s in settings} == {unit} == {members[0].name}
            want[unit] = (
                f"http://{members[0].dns}:{leader.port}",
                tuple(
                    f"http://{p.dns}:{s.health_port}"
                    for p, s in zip(members, settings, strict=True)
                ),
                leader.served_model_name,
            )
    got = {u.id: (u.leader, u.nodes) for u in config.units}
    assert got == {unit: (leader, nodes) for unit, (leader, nodes, _) in want.items()}
    assert {model for *_, model in want.values()} <= set(config.gateway.models)


def test_redis_is_where_the_state_points(config: Config) -> None:
    url = urlsplit(config.state.url)
    service = one(DOCS, "Service", "unitgate-redis")
    assert url.hostname == "unitgate-redis.unitgate.svc.cluster.local"
    assert url.port in {p["port"] for p in service["spec"]["ports"]}
    assert url.password is None  # from the Secret, through password_env
    redis = one(DOCS, "Deployment", "unitgate-redis")["spec"]["template"]
    assert service["spec"]["selector"].items() <= redis["metadata"]["labels"].items()


def secret_refs(container: Doc) -> dict[str, tuple[str, str]]:
    return {
        var["name"]: (ref["name"], ref["key"])
        for var in container.get("env", [])
        if (ref := var.get("valueFrom", {}).get("secretKeyRef"))
    }


def test_credentials_come_from_the_secret(config: Config) -> None:
    secret = one(documents(KUBE / "secret.example.yaml"), "Secret", "unitgate-secrets")
    keys = set(secret["stringData"])
    refs = secret_refs(gateway_container())
    assert refs[config.admin.token_env] == ("unitgate-secrets", "admin-token")
    assert refs[config.state.password_env] == ("unitgate-secrets", "redis-password")
    redis = one(DOCS, "Deployment", "unitgate-redis")["spec"]["template"]["spec"]["containers"][0]
    assert secret_refs(redis)["REDIS_PASSWORD"] == ("unitgate-secrets", "redis-password")
    used = {ref for c in (gateway_container(), redis) for ref in secret_refs(c).values()}
    assert {key for _, key in used} == keys
    assert all(value.startswith("REPLACE-") for value in secret["stringData"].values())


def test_the_deployment_runs_the_config_it_mounts(config: Config) -> None:
    deployment = one(DOCS, "Deployment", "unitgate-gateway")
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    container = gateway_container()
    args = container["args"]
    assert args[:2] == ["gateway", "--config"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert Path(args[2]) == Path(mount["mountPath"]) / "config.toml"
    volume = next(v for v in spec["template"]["spec"]["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == "unitgate-gateway-config"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": config.gateway.port, "operator": config.metrics.port}


def test_probes_readiness_is_readyz_and_liveness_healthz(config: Config) -> None:
    container = gateway_container()
    ready, live = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
    assert (ready["path"], ready["port"]) == ("/readyz", "http")
    assert (live["path"], live["port"]) == ("/healthz", "http")


def test_shutdown_fits_the_grace_period(config: Config) -> None:
    pod = one(DOCS, "Deployment", "unitgate-gateway")["spec"]["template"]["spec"]
    pre_stop = gateway_container()["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    grace = pod["terminationGracePeriodSeconds"]
    assert float(pre_stop[1]) + config.gateway.shutdown_timeout < grace


def test_services_and_the_budget_select_the_gateway_pods() -> None:
    labels = one(DOCS, "Deployment", "unitgate-gateway")["spec"]["template"]["metadata"]["labels"]
    container_ports = {p["name"] for p in gateway_container()["ports"]}
    api = one(DOCS, "Service", "unitgate-gateway")
    operator = one(DOCS, "Service", "unitgate-gateway-operator")
    for service in (api, operator):
        assert service["spec"]["selector"].items() <= labels.items()
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    assert [p["targetPort"] for p in api["spec"]["ports"]] == ["http"]  # no admin API there
    pdb = one(DOCS, "PodDisruptionBudget", "unitgate-gateway")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    replicas = one(DOCS, "Deployment", "unitgate-gateway")["spec"]["replicas"]
    assert pdb["spec"]["maxUnavailable"] < replicas


# vllm-stock.yaml runs no `unitgate node`: tests/deploy/test_watch_sidecar.py checks its header.
EXAMPLES = [
    (p, d)
    for p, d in every_document()
    if is_lws(d) and p.name.startswith("vllm-") and p.name != "vllm-stock.yaml"
]


@pytest.mark.parametrize(("path", "lws"), EXAMPLES, ids=[p.name for p, _ in EXAMPLES])
def test_each_example_says_how_the_gateway_lists_it(path: Path, lws: Doc) -> None:
    """The [[units]] entry in the example's header comment, with the model it names, is valid
    and matches the group, as the deployed config's entries do."""
    header = path.read_text().split("\napiVersion:", 1)[0]
    lines = [line.removeprefix("#").removeprefix(" ") for line in header.splitlines()]
    start = lines.index("  [[units]]")
    snippet = "\n".join(lines[start:]).split("\n\n", 1)[0]
    model = re.search(r'with "([^"]+)" in \[gateway\]\.models', header)
    assert model, "the header names the model to add to [gateway].models"
    raw = tomllib.loads(snippet)
    unit = config_from_dict({"gateway": {"models": [model[1]]}, **raw}).units[0]
    members = pods(lws)
    settings = [settings_of(pod) for pod in members]
    assert unit.id == settings[0].unit == members[0].name
    assert unit.leader == f"http://{members[0].dns}:{settings[0].port}"
    assert unit.nodes == tuple(
        f"http://{p.dns}:{s.health_port}" for p, s in zip(members, settings, strict=True)
    )
    assert settings[0].served_model_name == model[1]
