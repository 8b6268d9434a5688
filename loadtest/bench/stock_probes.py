"""What probing stock vLLM units costs the gateway: CPU per probe round, /metrics included.

One real `vllm serve` (the SmolLM2 export, pinned to one core) stands in for N units: every
unit of the gateway (`kind = "vllm"`) points at it, so each round probes its /health and,
every `load_interval`, reads its /metrics. The gateway runs pinned to the other core, first
with its probers on, then, as the baseline, with health off over the same units; the
difference in CPU time read from /proc over the same window is the probers' cost. Each
configuration is a (probe interval, load interval) pair; the figure the project aims at is
100 units probed every second for under 10% of a core.

    .venv-vllm/bin/python -m loadtest.bench.stock_probes --out bench-out [--units 100]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from loadtest.bench.processes import CLK_TCK, child, cpu_ticks, pin_cpus, pinned
from loadtest.readyfile import wait_http_ok

CONFIGS = ((1.0, 1.0), (1.0, 2.0), (0.25, 1.0), (0.25, 0.25))  # (probe, load interval) s
SERVED = "smol"
TOML = """\
[gateway]
port = 0
models = ["SmolLM2-135M-Instruct"]
[metrics]
port = 0
[health]
enabled = {enabled}
interval = {interval}
timeout = 0.5
[breaker]
enabled = false
[admin]
enabled = false
"""


@dataclass(frozen=True)
class Cost:
    units: int
    interval_s: float
    load_interval_s: float
    window_s: float
    probing_cpu_s: float
    idle_cpu_s: float
    healthy_units: int

    @property
    def per_round_us(self) -> float:
        rounds = self.units * self.window_s / self.interval_s
        return (self.probing_cpu_s - self.idle_cpu_s) / rounds * 1e6

    @property
    def cores(self) -> float:
        """The probers' share of one core: these units at this interval."""
        return self.per_round_us * self.units / self.interval_s / 1e6


def gateway_toml(url: str, units: int, enabled: bool, interval: float, load: float) -> str:
    head = TOML.format(enabled=str(enabled).lower(), interval=interval)
    body = "".join(
        f'[[units]]\nid = "v{i}"\nleader = "{url}"\nkind = "vllm"\n'
        f'served_model = "{SERVED}"\nload_interval = {load}\n'
        for i in range(units)
    )
    return head + body


def measure(
    tmp: Path, url: str, units: int, interval: float, load: float, window: float, cpu: int | None
) -> Cost:
    spent: dict[bool, float] = {}
    healthy = 0
    for enabled in (True, False):
        config = tmp / f"gw-{enabled}-{interval}-{load}.toml"
        config.write_text(gateway_toml(url, units, enabled, interval, load))
        ready = tmp / f"gw-{enabled}-{interval}-{load}.json"
        argv = ["gateway", "gateway", "--config", str(config), "--ready-file", str(ready)]
        with child(argv, ready, cpu, "gateway") as info:
            pid = int(info["pid"])
            time.sleep(3 * max(interval, load))  # first connects and rounds settle
            before = cpu_ticks(pid)
            time.sleep(window)
            spent[enabled] = (cpu_ticks(pid) - before) / CLK_TCK
            if enabled:
                with urllib.request.urlopen(info["metrics"] + "/metrics", timeout=10) as resp:
                    text = resp.read().decode()
                healthy = sum(
                    1
                    for line in text.splitlines()
                    if line.startswith("unitgate_unit_healthy{") and line.endswith(" 1.0")
                )
    return Cost(units, interval, load, window, spent[True], spent[False], healthy)


def start_vllm(tmp: Path, cpu: int | None) -> tuple[subprocess.Popen[bytes], str]:
    from engine.model.export import main as export
    from gateway.base.ports import free_port

    folder = tmp / "smollm2-hf"
    if export([str(folder), "--model", "smollm2"]) != 0:
        raise SystemExit("could not export the SmolLM2 folder")
    port = free_port()
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(cpu if cpu is not None else 0),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    argv = [
        *(sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)),
        *("--served-model-name", SERVED, "--dtype", "float32", "--enforce-eager"),
        *("--max-model-len", "2048", "--host", "127.0.0.1", "--port", str(port)),
    ]
    with pinned(cpu), (tmp / "vllm.log").open("wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(url + "/health", proc, 300.0, "vllm serve")
    return proc, url


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.stock_probes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="write DIR/stock_probes.json")
    p.add_argument("--units", type=int, default=100)
    p.add_argument("--window", type=float, default=20.0, help="seconds of CPU measured per run")
    args = p.parse_args(argv)
    pins = pin_cpus()
    with tempfile.TemporaryDirectory(prefix="stock-probes-") as name:
        tmp = Path(name)
        proc, url = start_vllm(tmp, pins.load if pins else None)
        try:
            costs = [
                measure(
                    tmp, url, args.units, interval, load, args.window, pins.relay if pins else None
                )
                for interval, load in CONFIGS
            ]
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            **asdict(c),
            "per_round_us": c.per_round_us,
            "cores": c.cores,
        }
        for c in costs
    ]
    (args.out / "stock_probes.json").write_text(json.dumps(rows, indent=2))
    print("interval  load every  per round  share of a core  healthy units")
    for c in costs:
        print(
            f"{c.interval_s:>7g}s {c.load_interval_s:>10g}s {c.per_round_us:>8.0f}us"
            f" {c.cores:>16.1%} {c.healthy_units:>8}/{c.units}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
