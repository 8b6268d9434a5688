"""`python -m loadtest.bench.rollout_real`: rollouts on real units, end to end.

`unitgate up` starts two cells of the builtin engine serving the packaged SmolLM2, each cell
with four one-node units: `weight_dtype = "float32"` (revision `f32`), `"float16"` (`f16`),
`"gguf"` (`gguf`: the file's own blocks), and the seeded random tiny weights (`tiny`, a model
that lost everything). A client keeps conversations going the whole time. Then, each over the
revision the cells serve:

1. `f16`: its greedy answers to the golden prompts match float32's; whether its speed passes
   the latency gates is what this host says (AVX2 has no float16 arithmetic);
2. `gguf`: the same answers, faster: the rollout succeeds;
3. `tiny`: the golden prompts' answers differ before any traffic moves, and the rollout is
   rolled back with the tiny units never having served a request.

It prints each rollout's outcome, its duration, the requests each revision served and the
client's failures, as a markdown table for docs/benchmarks.md. About 6 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from gateway.base.ports import free_port
from loadtest.bench.rollout_client import Tally, converse, ended, start

MODEL = "SmolLM2-135M-Instruct"
REVISIONS = {
    "f32": ("smollm2", "float32"),
    "f16": ("smollm2", "float16"),
    "gguf": ("smollm2", "gguf"),
    "tiny": ("", None),
}
# Questions with one right answer: an open one ("Say hello.") may flip a near tie of the greedy
# choice between float32 and float16 weights (docs/rollouts.md, "Golden prompts").
GOLDEN = [
    {"body": {"model": MODEL, "messages": [{"role": "user", "content": q}], "max_tokens": 16}}
    for q in ("What is the capital of France?", "What is 2+2?", "Who wrote Hamlet?")
]
STARTUP_S = 300.0
QUESTIONS = ("Hi!", "Tell me a short fact.", "Thanks.")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.rollout_real", description=__doc__)
    p.add_argument("--step-seconds", type=float, default=15.0, help="each step's length")
    p.add_argument("--concurrency", type=int, default=2, help="conversations at once")
    p.add_argument("--min-samples", type=int, default=20, help="[rollout.gates] min_samples")
    return p.parse_args(argv)


def config(tmp: Path, public: int, operator: int, min_samples: int) -> str:
    head = f"""\
[gateway]
port = {public}
models = ["{MODEL}"]
[metrics]
port = {operator}
[routing]
affinity = "session"
[admin]
state_file = "{tmp / "admin.sqlite3"}"
[rollout.gates]
min_samples = {min_samples}
"""
    units = ""
    for cell in ("a", "b"):
        for revision, (model, dtype) in REVISIONS.items():
            port = free_port()
            units += (
                f'[[units]]\nid = "{cell}-{revision}"\nleader = "http://127.0.0.1:{port}"\n'
                f'cell = "{cell}"\nrevision = "{revision}"\nmodel = "{model}"\n'
                f"max_seq_len = 512\nmax_inflight = 8\n"
            )
            if dtype is not None:
                units += f'weight_dtype = "{dtype}"\n'
    return head + units


@contextlib.contextmanager
def fleet(tmp: Path, token: str, min_samples: int) -> Any:
    public, operator = free_port(), free_port()
    path = tmp / "rollout.toml"
    path.write_text(config(tmp, public, operator, min_samples))
    env = {**os.environ, "UNITGATE_ADMIN_TOKEN": token}
    log = (tmp / "up.log").open("wb")
    argv = [sys.executable, "-m", "gateway", "up", "--config", str(path), "--log-dir", str(tmp)]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        yield f"http://127.0.0.1:{public}", f"http://127.0.0.1:{operator}"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def ready(http: aiohttp.ClientSession, operator: str) -> None:
    """Every unit routable or waiting only for its revision."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with http.get(operator + "/admin/units") as resp:
                if resp.status == 200:
                    units = (await resp.json())["units"]
                    if units and all(u["health"]["healthy"] for u in units):
                        return
        await asyncio.sleep(1.0)
    raise SystemExit(f"the units were not up within {STARTUP_S:g} s")


async def run(args: argparse.Namespace, public: str, operator: str, token: str) -> list[str]:
    headers = {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=120)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        aiohttp.ClientSession(timeout=timeout, headers=headers) as admin,
    ):
        await ready(admin, operator)
        rows, serving = [], "f32"
        for to in ("f16", "gguf", "tiny"):
            rows.append(await one(args, http, admin, public, operator, to, serving))
            if "| succeeded |" in rows[-1]:
                serving = to
        return rows


async def one(
    args: argparse.Namespace,
    http: aiohttp.ClientSession,
    admin: aiohttp.ClientSession,
    public: str,
    operator: str,
    to: str,
    old: str,
) -> str:
    """One rollout under the clients' conversations: its table row."""
    tally, stop = Tally(), asyncio.Event()
    clients = [
        asyncio.create_task(
            converse(http, public, MODEL, tally, stop, QUESTIONS, max_tokens=12, grow=True)
        )
        for _ in range(args.concurrency)
    ]
    ask = {"to": to, "from": old, "steps": [50, 100], "golden": GOLDEN,
           "step_seconds": args.step_seconds}  # fmt: skip
    await start(admin, operator, ask)
    done, seconds = await ended(admin, operator, every=1.0)
    stop.set()
    await asyncio.gather(*clients)
    failed = tally.failed
    by_revision = Counter(unit.split("-", 1)[-1] for unit in tally.served.elements())
    print(f"{old} -> {to}: {done['state']} after {seconds:.0f} s: {done['reason']}")
    for fail in failed[:5]:
        print(f"  failed: {fail}")
    return (
        f"| {old} -> {to} | {done['state']} | {seconds:.0f} s | "
        f"{dict(sorted(by_revision.items()))} | {len(failed)} | {done['reason']} |"
    )


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    token = secrets.token_urlsafe(32)
    with (
        tempfile.TemporaryDirectory(prefix="bench-rollout-real-") as tmp_name,
        fleet(Path(tmp_name), token, args.min_samples) as (public, operator),
    ):
        rows = asyncio.run(run(args, public, operator, token))
    print("\n| rollout | outcome | took | requests by revision | failed | reason |")
    print("|---|---|---:|---|---:|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
