"""Running a rollout's hooks: the operator's own command or URL, told what is happening.

A hook is defined in `[rollout.hooks.NAME]` (gateway/config/rollout.py), never by an admin
request. It is told the rollout's context: its id, the moment, the cell, the revisions and the
unit ids of the cell's old and new revision. A command gets them as environment variables
(`UNITGATE_ROLLOUT_*`, and the whole context as JSON in `UNITGATE_ROLLOUT_CONTEXT`) on top of
the gateway's own environment; a URL is POSTed them as a JSON object.

Whatever the hook does, `run_hook` returns a `HookResult` and does not raise: a failed, slow or
unreachable hook is the rollout's business to judge (usually: stop and roll back), not an
exception. Only cancellation propagates, after the command is killed.

A command runs in a session of its own, so that its process group holds it and whatever it
starts: on timeout, on cancellation and once it has exited, the group is killed, so a hook
leaves nothing running that nobody waits for (a hook that must start a lasting service hands
it to a service manager). A URL hook gets a client session per call: hooks run a few times per
step, so a shared session's pooled connections would buy nothing, and there is then no session
to own and close with the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
import orjson

from gateway.config.rollout import MOMENTS, HookConfig

TAIL_BYTES = 4096  # how much of a hook's last output (or its answer's start) a result keeps
REAP_S = 5.0  # seconds to wait for a killed command's exit to be collected
DRAIN_S = 1.0  # seconds to read what an exited command left in its pipe
# The context keys told as variables; lists of unit ids are joined with commas.
VARIABLES = {
    "rollout_id": "UNITGATE_ROLLOUT_ID",
    "moment": "UNITGATE_ROLLOUT_MOMENT",
    "cell": "UNITGATE_ROLLOUT_CELL",
    "from": "UNITGATE_ROLLOUT_FROM",
    "to": "UNITGATE_ROLLOUT_TO",
    "units_old": "UNITGATE_ROLLOUT_UNITS_OLD",
    "units_new": "UNITGATE_ROLLOUT_UNITS_NEW",
}


@dataclass(frozen=True, slots=True)
class HookResult:
    ok: bool
    what: str  # what was done: "ran /usr/bin/scale --up", "POST https://ops.example/hook"
    code: int | None  # the command's exit code or the URL's HTTP status; None: neither came
    seconds: float  # how long it took
    detail: str  # one plain sentence: how it ended, and why when it failed
    output: str = ""  # the command's last output (stdout and stderr), or the answer's start


def hook_context(
    rollout_id: str,
    moment: str,
    cell: str,
    old: str,
    new: str,
    units_old: list[str],
    units_new: list[str],
) -> dict[str, object]:
    """The context `run_hook` expects, under the keys it tells a hook (see VARIABLES)."""
    return {
        "rollout_id": rollout_id,
        "moment": moment,
        "cell": cell,
        "from": old,
        "to": new,
        "units_old": list(units_old),
        "units_new": list(units_new),
    }


async def run_hook(hook: HookConfig, moment: str, context: Mapping[str, object]) -> HookResult:
    """Run `hook` for `moment` with `context` (its "moment" is set to `moment`), within the
    hook's timeout. A moment the hook does not serve is skipped (ok, nothing run); a moment
    that is none of MOMENTS is a caller's mistake (ValueError)."""
    if moment not in MOMENTS:
        raise ValueError(f"moment {moment!r} is not one of {MOMENTS}")
    told = {**context, "moment": moment}
    if not hook.serves(moment):
        what = _what(hook)
        return HookResult(True, what, None, 0.0, f"skipped: it serves {', '.join(hook.when)}")
    if hook.command:
        return await _run_command(hook, told)
    return await _post(hook, told)


def variables(context: Mapping[str, object]) -> dict[str, str]:
    """The `UNITGATE_ROLLOUT_*` variables a command hook gets for `context`."""
    told = {name: _text(context.get(key, "")) for key, name in VARIABLES.items()}
    told["UNITGATE_ROLLOUT_CONTEXT"] = _json(context).decode()
    return told


async def _run_command(hook: HookConfig, context: Mapping[str, object]) -> HookResult:
    loop = asyncio.get_running_loop()
    started = loop.time()

    def result(ok: bool, code: int | None, detail: str, output: bytes = b"") -> HookResult:
        text = output.decode("utf-8", errors="replace")
        return HookResult(ok, _what(hook), code, loop.time() - started, detail, text)

    try:
        proc = await _spawn(hook, context)
    except OSError as exc:
        return result(False, None, f"could not start {hook.command[0]!r}: {_why(exc)}.")
    tail = bytearray()
    assert proc.stdout is not None  # stdout=PIPE
    reader = asyncio.create_task(_drain(proc.stdout, tail))
    try:
        async with asyncio.timeout(hook.timeout):
            code = await proc.wait()
            await asyncio.wait({reader}, timeout=DRAIN_S)  # what it wrote last, if it comes
    except TimeoutError:
        killed = f"timed out after {hook.timeout:g} s: its process group was killed."
        return result(False, None, killed, bytes(tail))
    finally:
        await _end(proc, reader)
    if code == 0:
        return result(True, 0, "exited with code 0.", bytes(tail))
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return result(False, code, f"{how}{_last_line(tail)}", bytes(tail))


async def _spawn(hook: HookConfig, context: Mapping[str, object]) -> asyncio.subprocess.Process:
    """The command, without a shell, in a session (and so a process group) of its own."""
    return await asyncio.create_subprocess_exec(
        *hook.command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **variables(context)},
        start_new_session=True,
    )


async def _drain(stream: asyncio.StreamReader, tail: bytearray) -> None:
    """Read the command's output to its end, keeping the last TAIL_BYTES."""
    while chunk := await stream.read(65536):
        tail += chunk
        del tail[:-TAIL_BYTES]


async def _end(proc: asyncio.subprocess.Process, reader: asyncio.Task[None]) -> None:
    """Kill what is left of the command's process group, collect its exit, stop reading.
    Runs on every way out, cancellation included."""
    reader.cancel()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), REAP_S)
    await asyncio.wait({reader})  # not `await reader`: that would swallow our own cancellation
    if not reader.cancelled():
        reader.exception()  # retrieved: a failed read only cuts the output short


async def _post(hook: HookConfig, context: Mapping[str, object]) -> HookResult:
    loop = asyncio.get_running_loop()
    started = loop.time()
    what = _what(hook)
    headers = {**hook.headers, "Content-Type": "application/json"}
    if token := hook.token():
        headers["Authorization"] = f"Bearer {token}"
    status, start = None, b""
    try:
        async with (
            asyncio.timeout(hook.timeout),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session,
            session.post(hook.url, data=_json(context), headers=headers) as answer,
        ):
            status = answer.status
            start = await answer.content.read(TAIL_BYTES)
    except TimeoutError:
        detail = f"got no answer within {hook.timeout:g} s."
    except (aiohttp.ClientError, OSError) as exc:
        detail = f"could not be reached: {_why(exc)}."
    else:
        detail = f"answered {status}."
    text = start.decode("utf-8", errors="replace")
    ok = status is not None and 200 <= status < 300
    return HookResult(ok, what, status, loop.time() - started, detail, text)


def _what(hook: HookConfig) -> str:
    if hook.command:
        shown = shlex.join(hook.command)
        return f"ran {shown if len(shown) <= 200 else shown[:197] + '...'}"
    parts = urlsplit(hook.url)  # without its query, which may carry a secret
    return f"POST {parts.scheme}://{parts.netloc}{parts.path}"


def _text(value: object) -> str:
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(str(v) for v in value)
    return str(value)


def _json(context: Mapping[str, object]) -> bytes:
    return orjson.dumps(dict(context), default=str)


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _last_line(tail: bytes | bytearray) -> str:
    lines = tail.decode("utf-8", errors="replace").strip().splitlines()
    return f"; its last line was {lines[-1][:200]!r}." if lines else " (no output)."
