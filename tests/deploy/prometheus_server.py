"""A real Prometheus server for the tests (Debian's `prometheus`): its own config and TSDB in
a temporary folder, its API on a free port of 127.0.0.1, stopped in the caller's `finally`.

Also the one mechanical change the end-to-end test makes to the shipped rules: every `for:`
divided by a factor, so a production `for: 1m` waits 1 s against units that a local
`unitgate up` restarts in a few seconds.
"""

from __future__ import annotations

import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from gateway.base.ports import free_ports
from loadtest.readyfile import wait_http_ok
from tests.deploy.promql import tool
from tests.support import stop_process

_DURATION = re.compile(r"(\d+)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_FOR = re.compile(r"^(\s*for:\s*)(\S+)\s*$", re.MULTILINE)


def seconds(duration: str) -> float:
    """A Prometheus duration ("1m", "1m30s", "500ms") in seconds."""
    parts = _DURATION.findall(duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)


def shorten_for(rules: str, factor: float) -> tuple[str, dict[str, float]]:
    """The rules text with every `for:` divided by `factor` (rounded to whole milliseconds),
    and the new `for:` of each alert in seconds. Nothing else changes: not the expressions,
    their windows, or the thresholds."""

    def divide(match: re.Match[str]) -> str:
        ms = round(seconds(match.group(2)) * 1000 / factor)
        return f"{match.group(1)}{ms}ms"

    text = _FOR.sub(divide, rules)
    holds = {
        rule["alert"]: seconds(rule.get("for", "0s"))
        for group in yaml.safe_load(text)["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    return text, holds


@dataclass
class Prometheus:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def get(self, path: str, **params: str) -> Any:
        """One API call; its `data` when the answer's status is success, else it fails."""
        query = "?" + urllib.parse.urlencode(params) if params else ""
        try:
            with urllib.request.urlopen(self.url + path + query, timeout=5) as resp:
                doc = orjson.loads(resp.read())
        except urllib.error.HTTPError as exc:  # a bad query answers 400 with a JSON error
            doc = orjson.loads(exc.read())
        assert doc.get("status") == "success", (path, params, doc)
        return doc["data"]

    def query(self, expr: str) -> Any:
        return self.get("/api/v1/query", query=expr)

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing); resolved ones are not listed."""
        data = self.get("/api/v1/alerts")
        return list(data["alerts"])

    def firing(self, name: str, **labels: str) -> list[dict[str, Any]]:
        return [
            a
            for a in self.alerts()
            if a["state"] == "firing"
            and a["labels"].get("alertname") == name
            and all(a["labels"].get(k) == v for k, v in labels.items())
        ]

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def close(self) -> None:
        stop_process(self.proc, 10.0)


def start_prometheus(
    tmp: Path,
    targets: dict[str, list[str]],
    rules: list[Path],
    interval: float,
    within: float = 30.0,
) -> Prometheus:
    """Scrapes each job's `host:port` targets every `interval` seconds and evaluates `rules`
    as often; returned once /-/ready answers 200."""
    every = f"{round(interval * 1000)}ms"
    config = {
        "global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every},
        "rule_files": [str(p) for p in rules],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": hosts}]}
            for job, hosts in targets.items()
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    (port,) = free_ports(1)
    log = tmp / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp,
        )
    server = Prometheus(proc, f"http://127.0.0.1:{port}", log)
    try:
        wait_http_ok(server.url + "/-/ready", proc, within, "prometheus")
    except RuntimeError as exc:
        server.close()
        raise RuntimeError(f"prometheus did not get ready ({exc}):\n{server.log_tail()}") from None
    return server
