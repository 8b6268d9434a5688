"""A pytest plugin loaded into vLLM's own test session (`-p conformance_plugin`): vLLM's
`RemoteOpenAIServer` is replaced by a class that starts nothing and points the test at a server
the harness (`run.py`) already runs, directly or through the gateway.

Each server a test asks for is a *spec*: its model and its `vllm serve` arguments, adapted to
the CPU in the few ways listed in `adapt_args` (what a GPU option names has no CPU meaning, and
every server here is float32, eager), or *not applicable* when it needs what no server here can
have (another model's weights, LoRA adapters, several GPUs, images). Three modes, from
UG_CONFORMANCE_MODE:

- `discover`: runs no test body against a server. Every test's fixtures are set up; a server
  fixture records its spec and skips, and each test is written out with the specs it needs,
  or as not applicable, or as offline (a unit test of vLLM's own classes, no server).
- `direct` and `gateway`: run the tests named in UG_CONFORMANCE_SELECT; a server fixture gets
  the base URL that UG_CONFORMANCE_SERVERS maps its spec to (a stock server, or the gateway in
  front of two), and every test's outcome is written out with its first error line.

This module is imported inside vLLM's test tree (whose `tests` package is vLLM's), so it
imports nothing of this project.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

MODE = os.environ.get("UG_CONFORMANCE_MODE", "")
OUT = os.environ.get("UG_CONFORMANCE_OUT", "")
MODEL = os.environ.get("UG_CONFORMANCE_MODEL", "HuggingFaceTB/SmolLM2-135M-Instruct")
MAX_MODEL_LEN = int(os.environ.get("UG_CONFORMANCE_MAX_MODEL_LEN", "8192"))
DISCOVERED = "ug-conformance: spec recorded"
NA = "not applicable: "

# Options whose servers cannot be had here: the reason is what the report says.
NOT_APPLICABLE = {
    "--speculative-config": "speculative decoding (a draft model)",
    "--tensor-parallel-size": "several devices",
    "-tp": "several devices",
    "--pipeline-parallel-size": "several devices",
    "-pp": "several devices",
    "--data-parallel-size": "several devices",
    "-dp": "several devices",
    "--uds": "a Unix socket (the gateway's units are TCP)",
    "--limit-mm-per-prompt": "a multimodal model",
    "--load-format": "a serialized checkpoint format",
    "--quantization": "a quantized checkpoint",
    "-q": "a quantized checkpoint",
    "--kv-transfer-config": "a KV transfer connector",
}
# GPU-only knobs, and what the harness sets itself: dropped with their value.
DROPPED = {"--gpu-memory-utilization", "--attention-backend", "--port", "--host", "--dtype"}
# LoRA: the adapters are hub downloads. The server runs without them; a test that asks for an
# adapter by name is not applicable, the module's other tests run.
LORA_VALUED = {
    "--lora-modules",
    "--lora-module",  # argparse takes a prefix: test_completion_with_prompt_embeds uses it
    "--max-lora-rank",
    "--max-loras",
    "--max-cpu-loras",
}
LORA_FLAGS = {"--enable-lora"}
# Options that take no value (the rest of the options met in vLLM's entrypoint tests do).
FLAGS = {
    "--enforce-eager",
    "--enable-auto-tool-choice",
    "--enable-prompt-tokens-details",
    "--enable-force-include-usage",
    "--enable-server-load-tracking",
    "--enable-log-outputs",
    "--enable-log-requests",
    "--no-enable-prefix-caching",
    "--enable-prefix-caching",
    "--enable-prompt-embeds",
    "--no-async-scheduling",
    "--return-tokens-as-token-ids",
    "--trust-remote-code",
    "--disable-log-stats",
    "--disable-log-requests",
    "--exclude-tools-when-tool-choice-none",
    "--enable-request-id-headers",
    "--disable-fastapi-docs",
    "--enable-tokenizer-info-endpoint",
    "--skip-tokenizer-init",
    "--enable-sleep-mode",
    "--disable-frontend-multiprocessing",
    "--enable-chunked-prefill",
    "--no-enable-chunked-prefill",
    "--enable-log-deltas",
    "--enable-mfu-metrics",
    "--enable-responses-api-store",
    "--enable-offline-docs",
    "--log-error-stack",
    *LORA_FLAGS,
}


class NotApplicable(Exception):
    """A spec no server here can have; the message says why."""


def is_option(token: str) -> bool:
    """`--name` or `-x`, not a negative number (`--max-logprobs -1`)."""
    return token.startswith("-") and len(token) > 1 and not token[1:].replace(".", "").isdigit()


def split_options(args: list[str]) -> Iterator[list[str]]:
    """`args` as options, each with its values: `--opt=v` stays one token, a flag has none,
    any other option takes the tokens up to the next one starting with `-`."""
    i = 0
    while i < len(args):
        token = args[i]
        j = i + 1
        if is_option(token) and "=" not in token and token not in FLAGS:
            while j < len(args) and not is_option(args[j]):
                j += 1
        yield args[i:j]
        i = j


def adapt_args(model: str, args: list[str], seed: int | None) -> tuple[list[str], list[str]]:
    """The `vllm serve` arguments the harness starts for a test's (model, args): CPU float32
    and eager, the context capped at the model's, GPU knobs and LoRA left out; with the LoRA
    adapter names the test module expected (its tests that use one are not applicable)."""
    if model != MODEL:
        raise NotApplicable(f"model {model} (only {MODEL} is here: no weights are downloaded)")
    kept: list[str] = []
    lora: list[str] = []
    for option in split_options(args):
        name = option[0].split("=", 1)[0]
        values = [option[0].split("=", 1)[1]] if "=" in option[0] else option[1:]
        if name in NOT_APPLICABLE:
            if name in {"-tp", "--tensor-parallel-size"} and values == ["1"]:
                continue
            raise NotApplicable(f"{name}: {NOT_APPLICABLE[name]}")
        if name == "--tokenizer" and values != [MODEL]:
            raise NotApplicable(f"--tokenizer {' '.join(values)} (another model's tokenizer)")
        if name in DROPPED or name in LORA_FLAGS:
            continue
        if name in LORA_VALUED:
            if name.startswith("--lora-module"):
                lora += [v.split("=", 1)[0] if "=" in v else json.loads(v)["name"] for v in values]
            continue
        if name == "--max-model-len" and values and values[0].isdigit():
            kept += [name, str(min(int(values[0]), MAX_MODEL_LEN))]
            continue
        kept += option
    if "--enforce-eager" not in kept:
        kept.append("--enforce-eager")
    kept += ["--dtype", "float32"]
    if seed is not None:
        kept += ["--seed", str(seed)]
    return kept, lora


def server_spec(
    model: str,
    args: list[str],
    env: dict[str, str] | None,
    seed: int | None,
    hf_overrides: dict[str, Any] | None,
) -> dict[str, Any]:
    extra = ["--hf-overrides", json.dumps(hf_overrides)] if hf_overrides is not None else []
    kept, lora = adapt_args(model, [*args, *extra], seed)
    # Some tests pass a copy of the whole environment: only what differs from it is the test's.
    own = {k: v for k, v in (env or {}).items() if os.environ.get(k) != v}
    return {"model": model, "args": kept, "env": own, "lora": lora}


def spec_key(spec: dict[str, Any]) -> str:
    return json.dumps({k: spec[k] for k in ("model", "args", "env")}, sort_keys=True)


def write(record: dict[str, Any]) -> None:
    with Path(OUT).open("a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


class State:
    """What the session learns: each server fixture's spec (discover), the fixture being set
    up (the innermost), the test running, the URL of each spec (run modes)."""

    fixtures: dict[str, dict[str, Any]] = {}
    setting_up: list[str] = []
    item: pytest.Item | None = None
    urls: dict[str, str] = {}
    selected: set[str] = set()
    outcomes: dict[str, dict[str, Any]] = {}


def fixture_key(argname: str, baseid: str, param_index: int) -> str:
    return f"{baseid}::{argname}[{param_index}]"


def item_fixture_keys(item: pytest.Item) -> list[str]:
    info = getattr(item, "_fixtureinfo", None)
    callspec = getattr(item, "callspec", None)
    keys = []
    for name in getattr(item, "fixturenames", ()):
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if defs:
            index = callspec.indices.get(name, 0) if callspec is not None else 0
            keys.append(fixture_key(name, defs[-1].baseid, index))
    return keys


def body_key(item: pytest.Item) -> str:
    return f"body::{item.nodeid}"


def make_server_class(base: type) -> type:
    """A subclass of vLLM's RemoteOpenAIServer (so its clients and `url_for` are vLLM's own)
    that starts no process."""

    class ConformanceServer(base):  # type: ignore[misc]
        def __init__(
            self,
            model: str,
            vllm_serve_args: list[str],
            *,
            env_dict: dict[str, str] | None = None,
            seed: int | None = 0,
            auto_port: bool = True,
            max_wait_seconds: float | None = None,
            override_hf_configs: dict[str, Any] | None = None,
        ) -> None:
            self._shutdown_complete = True
            key = State.setting_up[-1] if State.setting_up else None
            if key is None and State.item is not None:
                key = body_key(State.item)
            try:
                spec = server_spec(model, vllm_serve_args, env_dict, seed, override_hf_configs)
            except NotApplicable as exc:
                if MODE == "discover" and key is not None:
                    State.fixtures[key] = {"na": str(exc)}
                pytest.skip(NA + str(exc))
            if MODE == "discover":
                if key is not None:
                    State.fixtures.setdefault(key, {"specs": []})["specs"].append(spec)
                pytest.skip(DISCOVERED)
            url = State.urls.get(spec_key(spec))
            if url is None:
                pytest.skip(NA + "a server spec the discovery pass did not see")
            parts = urlsplit(url)
            self.uds = None
            self.host = parts.hostname
            self.port = parts.port
            self.show_hidden_metrics = False
            self._request_shutdown_timeout = 5.0
            self.conformance_spec = spec

        def _shutdown(self) -> None:
            """The harness owns the servers."""

    return ConformanceServer


def make_unsupported_class(base: type, what: str) -> type:
    class Unsupported(base):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._shutdown_complete = True
            pytest.skip(NA + what)

    return Unsupported


class OfflineHub:
    """vLLM's `hf_api()` for the test process: what the local cache holds (SmolLM2) is found
    there; LoRA adapters, which it does not hold, get a path that is never read (the servers
    run without adapters); the rest is the real client, offline."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def snapshot_download(self, repo_id: str, **kwargs: Any) -> str:
        try:  # SmolLM2 is in the local cache
            return str(self._real.snapshot_download(repo_id=repo_id, **kwargs))
        except Exception:  # offline: whatever the hub client raises
            return f"/nonexistent/ug-conformance/{repo_id}"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Before any conftest imports RemoteOpenAIServer (a module's conftest is loaded at start
    when its files are named on the command line, as the run modes do)."""
    import tests.utils as vllm_utils
    from vllm.transformers_utils import repo_utils

    real = vllm_utils.RemoteOpenAIServer
    vllm_utils.RemoteOpenAIServer = make_server_class(real)
    vllm_utils.RemoteOpenAIServerCustom = make_unsupported_class(
        real, "a server in a custom child process"
    )
    vllm_utils.RemoteLaunchRenderServer = make_unsupported_class(real, "`vllm launch render`")
    hub = OfflineHub(repo_utils.hf_api())
    repo_utils.hf_api = lambda: hub


def pytest_sessionstart(session: pytest.Session) -> None:
    if MODE in {"direct", "gateway"}:
        State.urls = json.loads(Path(os.environ["UG_CONFORMANCE_SERVERS"]).read_text())
        State.selected = set(Path(os.environ["UG_CONFORMANCE_SELECT"]).read_text().split("\n"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run modes keep the tests selected; discovery sets up only the tests that may start a
    server (the others, unit tests of vLLM's classes, are written out as offline at once)."""
    if MODE in {"direct", "gateway"}:
        keep = [item.nodeid in State.selected for item in items]
    elif MODE == "discover":
        keep = [may_start_server(item) for item in items]
        for item, kept in zip(items, keep, strict=True):
            if not kept:
                write(
                    {
                        "nodeid": item.nodeid,
                        "file": item.nodeid.split("::", 1)[0],
                        "status": "offline",
                    }
                )
    else:
        return
    config.hook.pytest_deselected(items=[i for i, k in zip(items, keep, strict=True) if not k])
    items[:] = [i for i, k in zip(items, keep, strict=True) if k]


def may_start_server(item: pytest.Item) -> bool:
    """Does the test or any fixture it uses name RemoteOpenAIServer in its source?"""
    info = getattr(item, "_fixtureinfo", None)
    funcs = [getattr(item, "function", None)]
    for name in getattr(item, "fixturenames", ()):
        defs = info.name2fixturedefs.get(name) if info is not None else None
        funcs += [defs[-1].func] if defs else []
    return any(mentions_server(func) for func in funcs if func is not None)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Generator[None, Any, Any]:
    State.setting_up.append(
        fixture_key(fixturedef.argname, fixturedef.baseid, getattr(request, "param_index", 0))
    )
    try:
        return (yield)
    finally:
        State.setting_up.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    State.item = item
    try:
        return (yield)
    finally:
        State.item = None
        if MODE == "discover":
            write(discovered(item))
        elif MODE:
            write({"nodeid": item.nodeid, **State.outcomes.pop(item.nodeid, {})})


def mentions_server(func: Any) -> bool:
    try:
        return "RemoteOpenAIServer" in inspect.getsource(func)
    except (OSError, TypeError):
        return False


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Discovery runs a test body only where the body itself starts a server."""
    if MODE == "discover" and not mentions_server(pyfuncitem.function):
        return True
    return None


def first_line(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    text = str(getattr(crash, "message", "") or longrepr or "")
    return next((line for line in text.splitlines() if line.strip()), "")[:300]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    record = State.outcomes.setdefault(report.nodeid, {"outcome": "passed", "message": ""})
    record.setdefault("phases", {})[report.when] = report.outcome
    if report.when == "call":
        record["duration"] = round(report.duration, 3)
    if record["outcome"] != "passed":
        return  # the first phase that did not pass says what happened
    xfail = hasattr(report, "wasxfail")
    if report.skipped:
        record["outcome"] = "xfailed" if xfail else "skipped"
        record["message"] = first_line(report)
    elif report.failed:
        record["outcome"] = "failed" if report.when == "call" else "error"
        record["message"] = first_line(report)
    elif xfail and report.when == "call":
        record["outcome"] = "xpassed"


def discovered(item: pytest.Item) -> dict[str, Any]:
    """One test's needs: the specs of the server fixtures it used, or why it cannot run."""
    outcome = State.outcomes.pop(item.nodeid, {"outcome": "passed", "message": ""})
    base = {"nodeid": item.nodeid, "file": item.nodeid.split("::", 1)[0]}
    specs: list[dict[str, Any]] = []
    for key in [*item_fixture_keys(item), body_key(item)]:
        entry = State.fixtures.get(key)
        if entry is not None and "na" in entry:
            return {**base, "status": "na", "reason": entry["na"]}
        specs += entry["specs"] if entry is not None else []
    params = getattr(getattr(item, "callspec", None), "params", {})
    adapters = {name for spec in specs for name in spec["lora"]}
    used = sorted(a for a in adapters if any(a in str(v) for v in params.values()))
    if used:
        return {**base, "status": "na", "reason": f"asks for LoRA adapter {', '.join(used)}"}
    if specs:
        unique = list({spec_key(s): s for s in specs}.values())
        return {**base, "status": "server", "specs": unique}
    if outcome["outcome"] == "error":
        return {**base, "status": "na", "reason": f"set-up failed: {outcome['message']}"}
    if outcome["outcome"] == "skipped" and outcome["message"] != DISCOVERED:
        return {**base, "status": "na", "reason": f"skipped: {outcome['message']}"}
    return {**base, "status": "offline"}
