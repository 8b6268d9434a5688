"""Hooks: a real command (its environment, exit code, timeout, cancellation) and a real URL."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gateway.config.rollout import HookConfig
from gateway.rollout.hooks import hook_context, run_hook
from tests.gateway.servers import refused_url, serve_app, until

CONTEXT = hook_context("r-1", "prepare", "eu-1", "v1", "v2", ["u0", "u1"], ["u2"])


def python(code: str, **hook: Any) -> HookConfig:
    return HookConfig(command=(sys.executable, "-c", code), **hook)


def gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting for whoever reaps it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True
    return state in ("Z", "X")


async def test_a_command_gets_the_context_in_its_environment(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    code = f"import json, os; open({str(out)!r}, 'w').write(json.dumps(dict(os.environ)))"
    result = await run_hook(python(code), "retire", CONTEXT)
    assert result.ok and result.code == 0, result
    assert result.detail == "exited with code 0."
    assert result.what.startswith(f"ran {sys.executable} -c ")
    env = json.loads(out.read_text())
    assert env["UNITGATE_ROLLOUT_ID"] == "r-1"
    assert env["UNITGATE_ROLLOUT_MOMENT"] == "retire"  # the moment run, not the context's
    assert env["UNITGATE_ROLLOUT_CELL"] == "eu-1"
    assert (env["UNITGATE_ROLLOUT_FROM"], env["UNITGATE_ROLLOUT_TO"]) == ("v1", "v2")
    assert env["UNITGATE_ROLLOUT_UNITS_OLD"] == "u0,u1"
    assert env["UNITGATE_ROLLOUT_UNITS_NEW"] == "u2"
    assert json.loads(env["UNITGATE_ROLLOUT_CONTEXT"]) == {**CONTEXT, "moment": "retire"}
    assert env["PATH"] == os.environ["PATH"]  # added to the gateway's own environment


async def test_a_failing_command_says_its_code_and_last_line() -> None:
    code = (
        "import sys; print('step 1', flush=True); "
        "print('cannot scale: quota', file=sys.stderr); sys.exit(3)"
    )
    result = await run_hook(python(code), "prepare", CONTEXT)
    assert not result.ok and result.code == 3
    assert result.detail == "exited with code 3; its last line was 'cannot scale: quota'."
    assert result.output.splitlines() == ["step 1", "cannot scale: quota"]


async def test_only_the_last_output_is_kept() -> None:
    code = "import sys; sys.stdout.write('x' * 100000 + 'END')"
    result = await run_hook(python(code), "prepare", CONTEXT)
    assert result.ok and result.output.endswith("xEND") and len(result.output) == 4096


async def test_stdin_is_closed() -> None:
    code = "import sys; sys.exit(0 if sys.stdin.read() == '' else 1)"
    assert (await run_hook(python(code), "prepare", CONTEXT)).ok


async def test_a_program_that_does_not_exist_is_a_failure_not_an_exception() -> None:
    hook = HookConfig(command=("/nonexistent/unitgate-hook",))
    result = await run_hook(hook, "done", CONTEXT)
    assert not result.ok and result.code is None
    assert result.detail.startswith("could not start '/nonexistent/unitgate-hook': ")


async def test_a_timeout_kills_the_command_and_its_children(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    code = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "print('waiting', flush=True)\n"
        "time.sleep(60)\n"
    )
    started = asyncio.get_running_loop().time()
    result = await run_hook(python(code, timeout=1.0), "prepare", CONTEXT)
    assert asyncio.get_running_loop().time() - started < 10
    assert not result.ok and result.code is None
    assert result.detail == "timed out after 1 s: its process group was killed."
    assert result.output == "waiting\n"
    for pid in map(int, pids.read_text().split()):
        await until(functools.partial(gone, pid), 5.0, f"process {pid} killed")


async def test_what_an_exited_command_left_running_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
    )
    started = asyncio.get_running_loop().time()
    result = await run_hook(python(code), "prepare", CONTEXT)
    # Done although the child still held its output pipe, within DRAIN_S and not the timeout.
    assert result.ok and result.output == "started\n"
    assert asyncio.get_running_loop().time() - started < 10
    pid = int(pid_file.read_text())
    await until(functools.partial(gone, pid), 5.0, f"process {pid} killed")


async def test_cancelling_kills_the_command_and_propagates(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    task = asyncio.create_task(run_hook(python(code), "prepare", CONTEXT))
    await until(lambda: pid_file.exists() and pid_file.read_text() != "", 10.0, "the hook runs")
    pid = int(pid_file.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gone(pid)  # killed and reaped before the cancellation propagated


async def test_a_moment_the_hook_does_not_serve_is_skipped(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    hook = python(f"open({str(marker)!r}, 'w')", when=("prepare",))
    result = await run_hook(hook, "done", CONTEXT)
    assert result.ok and result.detail == "skipped: it serves prepare"
    assert not marker.exists()
    with pytest.raises(ValueError, match="'deploy' is not one of"):
        await run_hook(hook, "deploy", CONTEXT)


async def test_a_url_hook_posts_the_context_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNITGATE_TEST_HOOK_TOKEN", "t0ken")
    seen: list[tuple[dict[str, str], Any]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append((dict(request.headers), await request.json()))
        return web.Response(text="scaled")

    app = web.Application()
    app.router.add_post("/hook", handler)
    async with serve_app(app) as base:
        hook = HookConfig(
            url=f"{base}/hook?sig=secret",
            headers={"X-Team": "ml"},
            token_env="UNITGATE_TEST_HOOK_TOKEN",
        )
        result = await run_hook(hook, "done", CONTEXT)
    assert result.ok and result.code == 200 and result.output == "scaled"
    assert result.what == f"POST {base}/hook"  # the query (a signature, say) is not shown
    assert result.detail == "answered 200."
    headers, body = seen[0]
    assert body == {**CONTEXT, "moment": "done"}
    assert headers["X-Team"] == "ml" and headers["Authorization"] == "Bearer t0ken"
    assert headers["Content-Type"] == "application/json"


async def test_a_url_hook_that_answers_an_error_or_nothing_fails() -> None:
    async def error(request: web.Request) -> web.Response:
        return web.Response(status=503, text="busy")

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response()

    app = web.Application()
    app.router.add_post("/error", error)
    app.router.add_post("/hang", hang)
    async with serve_app(app) as base:
        failed = await run_hook(HookConfig(url=f"{base}/error"), "rollback", CONTEXT)
        slow = await run_hook(HookConfig(url=f"{base}/hang", timeout=0.3), "rollback", CONTEXT)
    assert not failed.ok and failed.code == 503 and failed.output == "busy"
    assert failed.detail == "answered 503."
    assert not slow.ok and slow.code is None
    assert slow.detail == "got no answer within 0.3 s." and slow.seconds < 5


async def test_a_url_nobody_listens_at_fails() -> None:
    with refused_url() as url:
        result = await run_hook(HookConfig(url=f"{url}/hook"), "done", CONTEXT)
    assert not result.ok and result.code is None
    assert result.detail.startswith("could not be reached: ")
