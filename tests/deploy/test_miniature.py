"""deploy/kubernetes in miniature, on 127.0.0.1: the processes the manifests start, started the
way the image starts them, with what the cluster would give them.

- One unit: the `smollm2` LeaderWorkerSet's group 0, its leader and its worker, each as the
  image's ENTRYPOINT (the venv's `unitgate`) with the container's own args, `$(VAR)`s expanded
  from the pod's environment: LWS's three variables (the leader's address: 127.0.0.1) and the
  downward-API labels. Nothing else tells a node its rank, the world size or the rendezvous.
- A real redis-server with a password, where the ConfigMap's [state] points.
- One gateway replica: the image's ENTRYPOINT + CMD on the ConfigMap's config.toml.

What the loopback needs is changed and nothing else: every listener on 127.0.0.1 with a free
port (both pods would otherwise want :8001), the pods' DNS names in config.toml mapped to
those ports, and Redis' URL to the test server's socket. Group 1 is listed but not started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.base.ports import free_port
from loadtest.readyfile import wait_http_ok
from tests.deploy import dockerfile
from tests.deploy.manifests import Pod, deployed, gateway_toml, is_lws, one, pods, settings_of
from tests.engine.test_runtime_support import get_health
from tests.engine.test_up_support import Proc, stream_chat
from tests.redis_support import RedisServer, redis_server

pytestmark = pytest.mark.slow

VENV_BIN = Path(sys.executable).parent
TOKEN = "miniature-admin-token-4c9e1f7a2b"  # the gateway refuses short ones off loopback
PASSWORD = "miniature-redis-password"


@dataclass
class Cluster:
    nodes: list[Proc]
    node_health: list[int]
    leader_url: str
    gateway: Proc
    gateway_url: str
    operator_url: str
    redis: RedisServer


def entrypoint(*args: str) -> list[str]:
    """The image's ENTRYPOINT with `args`, resolved in the venv (the image's PATH puts its
    venv first)."""
    first, *rest = dockerfile.last("ENTRYPOINT").exec_form()
    return [str(VENV_BIN / first), *rest, *args]


def start(tmp: Path, name: str, argv: list[str], env: dict[str, str]) -> Proc:
    out = tmp / f"{name}.out"
    with out.open("wb") as f:
        proc = subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=tmp
        )
    return Proc(proc, out)


def start_node(tmp: Path, pod: Pod, ports: dict[str, int], master_port: int) -> Proc:
    env = {**pod.env(), "LWS_LEADER_ADDRESS": "127.0.0.1"}
    loopback = ["--health-host", "127.0.0.1", "--health-port", str(ports["health"])]
    if pod.index == 0:
        loopback += ["--host", "127.0.0.1", "--port", str(ports["api"])]
    argv = entrypoint(*pod.argv(), *loopback, "--master-port", str(master_port))
    return start(tmp, pod.name, argv, env)


def gateway_config(
    tmp: Path, redis: RedisServer, gw: int, ops: int
) -> tuple[Path, dict[str, dict[str, int]]]:
    """The ConfigMap's config.toml with every address moved to loopback; the ports each
    pod's listeners got."""
    text, _ = gateway_toml(deployed())
    swaps = {
        'host = "0.0.0.0"': 'host = "127.0.0.1"',
        "port = 8080": f"port = {gw}",
        "port = 8081": f"port = {ops}",
        'url = "redis://unitgate-redis.unitgate.svc.cluster.local:6379/0"': f'url = "{redis.url}"',
    }
    ports: dict[str, dict[str, int]] = {}
    for lws in (d for d in deployed() if is_lws(d)):
        for group in range(lws["spec"]["replicas"]):
            for pod in pods(lws, group):
                settings = settings_of(pod)
                mine = ports[pod.name] = {"health": free_port()}
                swaps[f"http://{pod.dns}:{settings.health_port}"] = (
                    f"http://127.0.0.1:{mine['health']}"
                )
                if pod.index == 0:
                    mine["api"] = free_port()
                    swaps[f"http://{pod.dns}:{settings.port}"] = f"http://127.0.0.1:{mine['api']}"
    for old, new in swaps.items():
        assert old in text, old
        text = text.replace(old, new)
    assert "cluster.local" not in text and "0.0.0.0" not in text
    path = tmp / "config.toml"
    path.write_text(text)
    return path, ports


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("miniature")
    lws = one(deployed(), "LeaderWorkerSet", "smollm2")
    gw, ops = free_port(), free_port()
    procs: list[Proc] = []
    with redis_server(tmp / "redis", password=PASSWORD) as redis:
        config, ports = gateway_config(tmp, redis, gw, ops)
        try:
            master = free_port()
            group = pods(lws, 0)
            nodes = [start_node(tmp, pod, ports[pod.name], master) for pod in group]
            procs += nodes
            cmd = dockerfile.last("CMD").exec_form()
            cmd[cmd.index("--config") + 1] = str(config)
            secrets = {"UNITGATE_ADMIN_TOKEN": TOKEN, "UNITGATE_REDIS_PASSWORD": PASSWORD}
            gateway = start(tmp, "gateway", entrypoint(*cmd), secrets)
            procs.append(gateway)
            nodes[0].wait_line("api_port=", 90)
            url = f"http://127.0.0.1:{gw}"
            wait_ready(url, gateway)
            health = [ports[pod.name]["health"] for pod in group]
            leader = f"http://127.0.0.1:{ports[group[0].name]['api']}"
            yield Cluster(nodes, health, leader, gateway, url, f"http://127.0.0.1:{ops}", redis)
            gateway.proc.send_signal(signal.SIGTERM)
            assert gateway.proc.wait(40) == 0, gateway.tail()
            nodes[0].proc.send_signal(signal.SIGTERM)  # STOPs the follower too
            for node in nodes:
                assert node.proc.wait(20) == 0, node.tail()
        finally:
            for proc in procs:
                proc.stop()


def wait_ready(url: str, gateway: Proc, within: float = 60.0) -> None:
    try:
        wait_http_ok(f"{url}/readyz", gateway.proc, within, "the gateway")
    except RuntimeError as exc:
        raise AssertionError(f"{exc}:\n{gateway.tail()}") from None


def test_each_node_took_its_place_from_lws(cluster: Cluster) -> None:
    reports = [get_health(port) for port in cluster.node_health]
    assert [status for status, _ in reports] == [200, 200]
    seen = [(body["role"], body["rank"], body["unit"]) for _, body in reports]
    assert seen == [("leader", 0, "smollm2-0"), ("follower", 1, "smollm2-0")]


def test_a_completion_from_the_leader_and_through_the_gateway(cluster: Cluster) -> None:
    assert stream_chat(cluster.leader_url, model="SmolLM2-135M-Instruct")
    try:
        assert stream_chat(cluster.gateway_url, model="SmolLM2-135M-Instruct")
    except Exception as exc:
        raise AssertionError(f"through the gateway: {exc}\n{verdicts(cluster)}") from exc


def admin(cluster: Cluster, path: str) -> Any:
    request = urllib.request.Request(
        f"{cluster.operator_url}{path}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        return json.loads(resp.read())


def verdicts(cluster: Cluster) -> str:
    """What a failure shows: each unit's health, breaker and admin state, the gateway's log."""
    units = admin(cluster, "/admin/units")["units"]
    seen = {u["id"]: (u["health"], u["breaker"]["state"], u["admin"]["state"]) for u in units}
    return f"units: {seen}\ngateway:\n{cluster.gateway.tail()}"


def test_the_replica_shares_its_state_under_its_hostname(cluster: Cluster) -> None:
    """[state].replica = "" names the replica `<hostname>:<pid>`: on Kubernetes, its pod."""
    routable = {u["id"]: u["routable"] for u in admin(cluster, "/admin/units")["units"]}
    expected = {"smollm2-0": True, "smollm2-1": False}  # group 1 is not started
    assert routable == expected, verdicts(cluster)
    client = cluster.redis.client()
    try:
        deadline = time.monotonic() + 5
        while not (reports := client.keys("unitgate:replica:*")) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        client.close()
    name = f"{os.uname().nodename}:{cluster.gateway.proc.pid}"
    assert [key.decode() for key in reports] == [f"unitgate:replica:{name}"]


def healthcheck(url: str) -> int:
    """The image's HEALTHCHECK command, run with the venv's python."""
    command = dockerfile.last("HEALTHCHECK").rest.partition(" CMD ")[2]
    argv = dockerfile.Instruction("CMD", command).exec_form()
    argv[0] = str(VENV_BIN / argv[0])
    env = {**os.environ, "UNITGATE_HEALTHCHECK_URL": url}
    return subprocess.run(argv, env=env, capture_output=True, timeout=30).returncode


def test_the_images_healthcheck(cluster: Cluster) -> None:
    assert healthcheck(f"{cluster.gateway_url}/healthz") == 0
    assert healthcheck(f"{cluster.gateway_url}/readyz") == 0
    for port in cluster.node_health:
        assert healthcheck(f"http://127.0.0.1:{port}/health") == 0
    assert healthcheck(f"http://127.0.0.1:{free_port()}/healthz") != 0  # nothing there
    assert healthcheck(f"{cluster.gateway_url}/nothing-here") != 0  # 404
