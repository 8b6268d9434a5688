"""The relays unitgate is measured against, run beside it in the same benchmark: nginx (C) and
vllm-router (Rust), each pinned to the relay CPU and proxying to the same simulated leaders.

A peer runs when it is installed (`make bench` installs both: nginx from Debian as root,
vllm-router from PyPI) and is left out of the table, with one line saying so, when not. Both
are configured the way an operator streaming tokens would run them: nginx with one worker
process, keep-alive upstream connections and response buffering off; vllm-router with its
round-robin policy over the two leaders.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from gateway.base.ports import free_port
from loadtest.bench.processes import READY_TIMEOUT_S, pinned, stop_child
from loadtest.readyfile import wait_http_ok

NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/nginx-body;
    proxy_temp_path {tmp}/nginx-proxy;
    upstream units {{
{servers}
        keepalive 512;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://units;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


def versions() -> dict[str, str | None]:
    """Each peer's version, None where it is not installed."""
    found: dict[str, str | None] = {"nginx": None, "vllm-router": None}
    if nginx := shutil.which("nginx"):
        out = subprocess.run([nginx, "-v"], capture_output=True, text=True, check=False)
        match = re.search(r"nginx/(\S+)", out.stderr)
        found["nginx"] = match.group(1) if match else "unknown"
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        found["vllm-router"] = importlib.metadata.version("vllm-router")
    return found


@contextlib.contextmanager
def nginx(tmp: Path, leaders: tuple[str, ...], cpu: int | None) -> Iterator[tuple[str, int]]:
    """(URL, pid of the master, whose tree holds the worker) of a running nginx."""
    binary = shutil.which("nginx")
    assert binary is not None
    port = free_port()
    servers = "\n".join(f"        server {url.removeprefix('http://')};" for url in leaders)
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, servers=servers, port=port))
    argv = [binary, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "nginx-error.log")]
    with _running(argv, port, cpu, "nginx") as peer:
        yield peer


@contextlib.contextmanager
def vllm_router(
    leaders: tuple[str, ...], cpu: int | None, policy: str = "round_robin"
) -> Iterator[tuple[str, int]]:
    """(URL, pid) of a running vllm-router (its Rust server runs inside this process), with
    its `--policy`; its metrics on a free port, not its default 29000 (another benchmark's
    router may hold that)."""
    port = free_port()
    argv = [sys.executable, "-m", "vllm_router.launch_router", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--prometheus-port", str(free_port())]
    argv += ["--policy", policy, "--worker-urls", *leaders]
    with _running(argv, port, cpu, "vllm-router") as peer:
        yield peer


@contextlib.contextmanager
def _running(argv: list[str], port: int, cpu: int | None, what: str) -> Iterator[tuple[str, int]]:
    """`argv` pinned to `cpu`, ready once it proxies /v1/models; stopped on exit."""
    with pinned(cpu):
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(url + "/v1/models", proc, READY_TIMEOUT_S, what)
        yield url, proc.pid
    finally:
        stop_child(proc)
