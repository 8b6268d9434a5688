"""`make conformance`: vLLM's own OpenAI-server tests against a stock vLLM directly and through
the gateway in front of two, and the differences.

1. Set-up (cached in `.conformance/`): vLLM's tests from the pinned sdist, model ids rewritten
   to SmolLM2, SmolLM2 as a local Hugging Face cache entry (`sources.py`).
2. Discovery: one pytest session over the selected test files in which no server starts
   (`pytest_plugin/conformance_plugin.py`): each test's server spec (its module's `vllm serve`
   arguments), or not applicable, or offline (a unit test with no server).
3. For each group of tests needing the same specs: three fresh servers per spec and a gateway
   over two of them (`servers.py`); the group's tests run directly against the first, then
   through the gateway; then everything is stopped.
4. The table, and `.conformance/result.json` and `result.md` (`report.py`). Exit status 1 if a
   test passes directly but fails through the gateway and `known_differences.txt` does not
   name it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

import report
from rewrite_models import SMOLLM2
from servers import Deployment, StartError, deployment, group_alive
from sources import VLLM_VERSION, max_model_len, smollm2_cache, vllm_tests

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CACHE = ROOT / ".conformance"
# vLLM's tests of its OpenAI-compatible server: completions, chat, tool calls, logprobs, token
# ids, the Responses and Messages APIs, tokenization, models.
SELECTION = (
    "tests/entrypoints/openai",
    "tests/entrypoints/anthropic",
    "tests/entrypoints/serve/tokenize",
    "tests/entrypoints/tool_parsers",
)
# Files not collected at all, with the reason (the report lists them).
EXCLUDED = {
    "tests/entrypoints/openai/correctness": "accuracy evaluations: lm-eval and its data sets",
    "tests/entrypoints/openai/test_openai_schema.py": "schemathesis over a multimodal model",
    "tests/entrypoints/tool_parsers/test_openai_tool_parser.py": "gpt-oss's Harmony tools",
}
# pytest-timeout, per test, both ways. A test here takes seconds; one whose answer runs on to
# the context's end (SmolLM2 does not stop where the tests' models do) would take minutes.
TEST_TIMEOUT_S = 60
RERUNS = 2  # more runs through the gateway of a test that passed directly only
SESSION_SLACK_S = 600.0  # a pytest session's deadline: this plus the timeout per test


def base_env(hf_home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    }


def pytest_session(
    root: Path,
    mode: str,
    files: list[str],
    env: dict[str, str],
    workdir: Path,
    deadline: float,
    extra: dict[str, str] | None = None,
    name: str = "",
) -> list[dict[str, Any]]:
    """One pytest session of vLLM's tests with the plugin in `mode`: its records (in
    `name`.jsonl, its output in `name`.log; `name` is the mode's by default)."""
    name = name or mode
    out = workdir / f"{name}.jsonl"
    out.unlink(missing_ok=True)
    session_env = {
        **env,
        **(extra or {}),
        "PYTHONPATH": os.pathsep.join([str(CACHE / "site"), str(HERE / "pytest_plugin")]),
        "UG_CONFORMANCE_MODE": mode,
        "UG_CONFORMANCE_OUT": str(out),
        "UG_CONFORMANCE_MODEL": SMOLLM2,
        "UG_CONFORMANCE_MAX_MODEL_LEN": env["UG_CONFORMANCE_MAX_MODEL_LEN"],
    }
    argv = [sys.executable, "-m", "pytest", "-p", "conformance_plugin", "-p", "no:cacheprovider"]
    argv += ["-q", "-rN", f"--timeout={env['UG_CONFORMANCE_TIMEOUT']}", *files]
    argv += [f"--ignore={path}" for path in EXCLUDED]
    with (workdir / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(
            argv,
            cwd=root,
            env=session_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(deadline)
        except subprocess.TimeoutExpired:
            print(f"  {name}: pytest still running after {deadline:.0f} s: stopped")
        finally:
            stop_group(proc)
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line]


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not group_alive(proc.pid):
            break
        os.killpg(proc.pid, sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            continue


def discover(
    root: Path, env: dict[str, str], workdir: Path, only: list[str], exclude: list[str]
) -> list[dict[str, Any]]:
    print("discovery: which server each test needs (no server starts) ...", flush=True)
    started = time.monotonic()
    records = pytest_session(root, "discover", list(SELECTION), env, workdir, 1800.0)
    if not records:
        raise SystemExit(f"discovery recorded nothing: see {workdir / 'discover.log'}")
    records = [
        r
        for r in records
        if (not only or any(text in r["nodeid"] for text in only))
        and not any(text in r["nodeid"] for text in exclude)
    ]
    counts: defaultdict[str, int] = defaultdict(int)
    for record in records:
        counts[record["status"]] += 1
    print(
        f"  {counts['server']} tests to run, {counts['na']} not applicable, "
        f"{counts['offline']} offline unit tests ({time.monotonic() - started:.0f} s)"
    )
    return records


def groups(records: list[dict[str, Any]]) -> list[tuple[dict[str, dict[str, Any]], list[str]]]:
    """Tests by the specs they need, biggest groups first."""
    by_specs: dict[tuple[str, ...], list[str]] = defaultdict(list)
    specs: dict[str, dict[str, Any]] = {}
    for record in records:
        if record["status"] == "server":
            keys = []
            for spec in record["specs"]:
                key = json.dumps({k: spec[k] for k in ("model", "args", "env")}, sort_keys=True)
                specs[key] = spec
                keys.append(key)
            by_specs[tuple(sorted(keys))].append(record["nodeid"])
    ordered = sorted(by_specs.items(), key=lambda kv: -len(kv[1]))
    return [({k: specs[k] for k in keys}, nodeids) for keys, nodeids in ordered]


def run_group(
    root: Path,
    specs: dict[str, dict[str, Any]],
    nodeids: list[str],
    env: dict[str, str],
    workdir: Path,
) -> dict[str, dict[str, dict[str, Any]]]:
    """The group's tests directly, then through the gateway: {mode: {nodeid: outcome}}."""
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    started = time.monotonic()
    with deployment(specs, env, workdir) as dep:
        print(f"  servers and gateway up in {time.monotonic() - started:.0f} s", flush=True)
        for mode in ("direct", "gateway"):
            results[mode] = run_mode(root, mode, dep, nodeids, env, workdir)
        rerun_differences(root, dep, results, env, workdir)
    return results


def rerun_differences(
    root: Path,
    dep: Deployment,
    results: dict[str, dict[str, dict[str, Any]]],
    env: dict[str, str],
    workdir: Path,
) -> None:
    """A test that passed directly but not through the gateway runs through the gateway up to
    RERUNS times more: one that passes then samples at random (an unseeded temperature) or
    races, and is reported as flaky, not as a difference. Each rerun is kept on the test."""
    for attempt in range(1, RERUNS + 1):
        failing = [
            n
            for n, r in results["gateway"].items()
            if results["direct"][n]["outcome"] == "passed"
            and r["outcome"] != "passed"
            and not r.get("passed_on_rerun")
        ]
        if not failing:
            return
        again = run_mode(root, "gateway", dep, failing, env, workdir, f"gateway-rerun{attempt}")
        for nodeid, record in again.items():
            first = results["gateway"][nodeid]
            first.setdefault("reruns", []).append(record["outcome"])
            if record["outcome"] == "passed":
                first["passed_on_rerun"] = attempt


def run_mode(
    root: Path,
    mode: str,
    dep: Deployment,
    nodeids: list[str],
    env: dict[str, str],
    workdir: Path,
    name: str = "",
) -> dict[str, dict[str, Any]]:
    """`nodeids` directly or through the gateway (`mode`), in a pytest session of its own
    (`name`: its files' names, the mode's by default)."""
    name = name or mode
    urls = dep.direct if mode == "direct" else dep.gateway
    (workdir / f"{name}.servers.json").write_text(json.dumps(urls, indent=1))
    (workdir / f"{name}.select.txt").write_text("\n".join(nodeids) + "\n")
    extra = {
        "UG_CONFORMANCE_SERVERS": str(workdir / f"{name}.servers.json"),
        "UG_CONFORMANCE_SELECT": str(workdir / f"{name}.select.txt"),
    }
    files = sorted({n.split("::", 1)[0] for n in nodeids})
    started = time.monotonic()
    deadline = SESSION_SLACK_S + int(env["UG_CONFORMANCE_TIMEOUT"]) * len(nodeids)
    records = pytest_session(root, mode, files, env, workdir, deadline, extra, name)
    got = {r["nodeid"]: r for r in records}
    dead = dep.dead()
    missing = {"outcome": "error", "message": f"no result (see {workdir / (name + '.log')})"}
    outcomes = {n: got.get(n, dict(missing)) for n in nodeids}
    passed = sum(1 for r in outcomes.values() if r["outcome"] == "passed")
    print(
        f"  {name}: {passed}/{len(nodeids)} passed in {time.monotonic() - started:.0f} s"
        + (f"; died meanwhile: {', '.join(dead)}" if dead else ""),
        flush=True,
    )
    return outcomes


def not_started(nodeids: list[str], error: StartError) -> list[dict[str, Any]]:
    reason = "the servers did not start with the module's arguments: " + next(
        (ln for ln in reversed(str(error).splitlines()) if "Error" in ln),
        str(error).splitlines()[0],
    )
    return [{"nodeid": n, "status": "na", "reason": reason[:300]} for n in nodeids]


def interrupt(signum: int, frame: FrameType | None) -> None:
    """The first SIGINT or SIGTERM stops the run; the clean-up (bounded) is not interrupted."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tests/conformance/run.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--only", action="append", default=[], help="run only the tests whose id contains this"
    )
    parser.add_argument(
        "--exclude", action="append", default=[], help="leave out the tests whose id contains this"
    )
    parser.add_argument(
        "--timeout", type=int, default=TEST_TIMEOUT_S, help="seconds per test, both ways"
    )
    parser.add_argument(
        "--budget", type=float, default=0.0, help="minutes after which no new group starts"
    )
    parser.add_argument("--out", type=Path, default=CACHE, help="where result.json/.md go")
    ns = parser.parse_args(argv)
    for signum in (signal.SIGINT, signal.SIGTERM):  # an interrupted run still stops its servers
        signal.signal(signum, interrupt)
    started = time.monotonic()
    CACHE.mkdir(exist_ok=True)
    (CACHE / ".gitignore").write_text("*\n")
    root = vllm_tests(CACHE)
    hf_home = smollm2_cache(CACHE)
    env = {
        **base_env(hf_home),
        "UG_CONFORMANCE_MAX_MODEL_LEN": str(max_model_len(hf_home)),
        "UG_CONFORMANCE_TIMEOUT": str(ns.timeout),
    }
    workdir = CACHE / "run"
    workdir.mkdir(exist_ok=True)
    discovered = discover(root, env, workdir, ns.only, ns.exclude)
    results: dict[str, dict[str, dict[str, Any]]] = {"direct": {}, "gateway": {}}
    plan = groups(discovered)
    for i, (specs, nodeids) in enumerate(plan, 1):
        files = sorted({n.split("::", 1)[0].rsplit("/", 1)[-1] for n in nodeids})
        print(f"[{i}/{len(plan)}] {len(nodeids)} tests of {', '.join(files)}", flush=True)
        if ns.budget and time.monotonic() - started > ns.budget * 60:
            print(f"  not run: the {ns.budget:g} min budget is spent")
            discovered = [r for r in discovered if r["nodeid"] not in set(nodeids)]
            discovered += [
                {"nodeid": n, "status": "na", "reason": "not run: time budget"} for n in nodeids
            ]
            continue
        try:
            group = run_group(root, specs, nodeids, env, workdir / f"group{i:02d}")
        except StartError as exc:
            print(f"  not started: {str(exc).splitlines()[0]}")
            skipped = {r["nodeid"] for r in not_started(nodeids, exc)}
            discovered = [r for r in discovered if r["nodeid"] not in skipped]
            discovered += not_started(nodeids, exc)
            continue
        for mode, outcomes in group.items():
            results[mode].update(outcomes)
    meta = {
        "vllm": VLLM_VERSION,
        "model": SMOLLM2,
        "unitgate": git_revision(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "took_s": round(time.monotonic() - started),
        "excluded_files": EXCLUDED,
        "test_timeout_s": ns.timeout,
        "options": argv if argv is not None else sys.argv[1:],
    }
    summary = report.summarize(discovered, results, meta)
    print()
    print(report.table(summary))
    json_path, md_path = report.write(summary, ns.out)
    print(f"\n{json_path}\n{md_path}  ({summary['took_s'] / 60:.0f} min)")
    return 1 if summary["counts"]["unexplained_differences"] else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:
        print(f"\ninterrupted ({exc}): every server, gateway and pytest session stopped")
        sys.exit(130)
