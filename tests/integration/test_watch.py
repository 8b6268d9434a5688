"""`unitgate watch` on real processes: a real sidecar (`python -m gateway watch`) watching a
real process through /proc while the test stops, continues, kills and restarts it; and a real
gateway ejecting a unit whose follower node is the sidecar.

Every wait polls with a deadline; every process started here is killed in a `finally`.
Detection times are printed (run with -s to see them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.health_states import Health
from gateway.watch import cli
from tests.integration.probing import probed, until
from tests.simunits.split import planned_units, start_part, units_toml
from tests.support import ROOT, stop_process

SLEEPER = "import time; time.sleep(120)"


@dataclass
class Sidecar:
    proc: subprocess.Popen[bytes]
    out: Path
    url: str = ""

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def health(self) -> tuple[int, dict[str, Any]]:
        """One probe: HTTP status and JSON body."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                return resp.status, orjson.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, orjson.loads(exc.read())

    def until(self, ok: Callable[[int, dict[str, Any]], bool], within: float, what: str) -> float:
        """Probe until `ok(status, body)`; seconds it took. Fails with the last answer."""
        start = time.monotonic()
        while True:
            status, body = self.health()
            if ok(status, body):
                return time.monotonic() - start
            if time.monotonic() - start > within:
                raise AssertionError(f"{what}: not within {within} s; last {status} {body}")
            time.sleep(0.01)

    def until_status(self, status: str, within: float) -> tuple[float, dict[str, Any]]:
        seen: dict[str, Any] = {}

        def ok(code: int, body: dict[str, Any]) -> bool:
            seen.update(body)
            return body["status"] == status and code == (200 if status == "ok" else 503)

        took = self.until(ok, within, f"status {status}")
        return took, seen


@contextlib.contextmanager
def sidecar(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Sidecar]:
    """`python -m gateway watch ARGS` on 127.0.0.1, a free port, until SIGTERM (exit 0)."""
    out = tmp / f"watch-{uuid.uuid4().hex[:6]}.out"
    with out.open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "watch", *args, "--host", "127.0.0.1", "--port", "0"],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**(os.environ if env is None else env), "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
        )
    car = Sidecar(proc, out)
    try:
        car.url = f"http://127.0.0.1:{wait_line(car, 'health_port=', 30)}"
        yield car
    finally:
        code = stop_process(proc)
    assert code == 0, car.text()  # SIGTERM stops it cleanly


def wait_line(car: Sidecar, prefix: str, within: float) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for line in car.text().splitlines():
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        if car.proc.poll() is not None:
            raise AssertionError(f"watch exited {car.proc.returncode}:\n{car.text()}")
        time.sleep(0.02)
    raise AssertionError(f"no {prefix!r} line within {within} s:\n{car.text()}")


@contextlib.contextmanager
def process(*argv: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process to watch; continued (a stopped one ignores SIGKILL until then) and killed."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE)
    try:
        yield proc
    finally:
        kill(proc)


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL and reap (an unreaped child is a zombie, not gone)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait(10)


def sleeper(marker: str = "") -> list[str]:
    return [sys.executable, "-c", SLEEPER, *([marker] if marker else [])]


# ---- the sidecar alone


def test_stopped_continued_and_killed(tmp_path: Path) -> None:
    with (
        process(*sleeper()) as target,
        sidecar(tmp_path, "--pid", str(target.pid), "--unit", "u0", "--rank", "1") as car,
    ):
        _, body = car.until_status("ok", 5)
        assert {k: body[k] for k in ("unit", "rank", "role", "pid")} == {
            "unit": "u0",
            "rank": 1,
            "role": "follower",
            "pid": target.pid,
        }
        assert isinstance(body["cpu_ticks"], int) and body["state"] in "RS"
        os.kill(target.pid, signal.SIGSTOP)
        stopped, body = car.until_status("stopped", 2)
        assert "stopped by a signal" in body["error"]
        os.kill(target.pid, signal.SIGCONT)
        car.until_status("ok", 2)
        target.kill()
        target.wait(5)
        killed, body = car.until_status("gone", 2)
        assert body["error"] == f"process {target.pid} has exited"
    print(f"\nsidecar answers: SIGSTOP -> 503 in {stopped:.3f} s, SIGKILL -> 503 in {killed:.3f} s")
    assert stopped < 0.5 and killed < 0.5  # read at probe time: the first probe after it


def test_an_unreaped_child_is_a_zombie(tmp_path: Path) -> None:
    parent_code = (
        "import os, sys, time\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    os._exit(0)\n"
        "print(child, flush=True)\n"
        "time.sleep(120)\n"  # never reaps it
    )
    with process(sys.executable, "-c", parent_code) as parent:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        with sidecar(tmp_path, "--pid", str(child), "--unit", "u0", "--rank", "2") as car:
            _, body = car.until_status("zombie", 5)
    assert body["pid"] == child and body["state"] == "Z"
    assert body["error"].endswith("has exited and is not reaped yet (state Z)")


def test_match_finds_the_process_again_after_a_restart(tmp_path: Path) -> None:
    marker = f"watch-target-{uuid.uuid4().hex}"
    with (
        process(*sleeper(marker)) as first,
        sidecar(tmp_path, "--match", f"{marker}$", "--unit", "u0", "--rank", "1") as car,
    ):
        _, body = car.until_status("ok", 5)
        assert body["pid"] == first.pid  # not the sidecar, whose command line holds it too
        kill(first)
        car.until_status("gone", 2)
        with process(*sleeper(marker)) as second:
            took, body = car.until_status("ok", 2)
            assert body["pid"] == second.pid != first.pid
    print(f"\n--match: the restarted process found {took:.3f} s after it started")
    assert f"watching process {second.pid}" in car.text()


def test_pidfile_is_reread_when_the_process_is_gone(tmp_path: Path) -> None:
    pidfile = tmp_path / "follower.pid"
    with sidecar(tmp_path, "--pidfile", str(pidfile), "--unit", "u0", "--rank", "1") as car:
        _, body = car.until_status("gone", 2)
        assert body["error"] == f"no process found by --pidfile {pidfile}"
        with process(*sleeper()) as first:
            pidfile.write_text(f"{first.pid}\n")
            _, body = car.until_status("ok", 2)
            assert body["pid"] == first.pid
            kill(first)
            car.until_status("gone", 2)
            with process(*sleeper()) as second:
                pidfile.write_text(f"{second.pid}\n")
                _, body = car.until_status("ok", 2)
                assert body["pid"] == second.pid


def test_unit_and_rank_from_the_leaderworkerset_environment(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "LWS_LEADER_ADDRESS": "llama-stock-0.llama-stock.unitgate",
        "LWS_GROUP_SIZE": "3",
        "LWS_WORKER_INDEX": "2",
    }
    with (
        process(*sleeper()) as target,
        sidecar(tmp_path, "--pid", str(target.pid), "--from-env", "lws", env=env) as car,
    ):
        _, body = car.until_status("ok", 5)
    assert (body["unit"], body["rank"], body["role"]) == ("llama-stock-0", 2, "follower")


def test_sigint_stops_it_cleanly(tmp_path: Path) -> None:
    with (
        process(*sleeper()) as target,
        sidecar(tmp_path, "--pid", str(target.pid), "--unit", "u0", "--rank", "1") as car,
    ):
        car.proc.send_signal(signal.SIGINT)
        assert car.proc.wait(10) == 0
    assert "Traceback" not in car.text()


def free_pid() -> int:
    """A pid no process has right now: one just reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--unit", "u0", "--rank", "1"], "one of the arguments --pid --pidfile --match"),
        (["--pid", "0", "--unit", "u0", "--rank", "1"], "argument --pid: must be a process id"),
        (["--pid", "x", "--unit", "u0", "--rank", "1"], "argument --pid: must be a process id"),
        (["--match", "(", "--unit", "u0", "--rank", "1"], "--match: not a regular expression"),
        (["--match", "", "--unit", "u0", "--rank", "1"], "--match: must not be empty"),
        (["--pid", "1", "--match", "x", "--unit", "u0", "--rank", "1"], "not allowed with"),
        (["--pid", "1", "--rank", "1"], "--unit: required, unless --from-env lws"),
        (["--pid", "1", "--unit", "u0"], "--rank: required, unless --from-env lws"),
        (["--pid", "1", "--unit", "u0", "--rank", "-1"], "--rank: must be >= 0"),
        (["--pid", "1", "--unit", "u0", "--rank", "1", "--port", "70000"], "--port: must be"),
        (["--pid", "1", "--from-env", "lws"], "LWS_LEADER_ADDRESS: not set"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def test_a_pid_with_no_process_exits_2_through_the_command_line() -> None:
    pid = free_pid()
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "watch", "--pid", str(pid), "--unit", "u", "--rank", "1"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 2
    assert f"--pid {pid}: no such process" in done.stderr


def test_the_sidecar_needs_only_the_gateways_dependencies() -> None:
    """It runs in a slim image: no torch, numpy or engine runtime behind its imports."""
    code = (
        "import sys, gateway.watch.cli, gateway.watch.app\n"
        "heavy = {'torch', 'numpy', 'engine.runtime', 'engine.backends', 'prometheus_client'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert done.stdout.strip() == "[]", done.stderr


# ---- a real gateway probing the sidecar as a unit's follower


@pytest.mark.slow
async def test_the_gateway_ejects_the_unit_when_the_watched_follower_stops_or_dies(
    tmp_path: Path,
) -> None:
    (unit,) = planned_units([2])  # u0: the leader a simulated node, node 1 the sidecar's
    with (
        process(*sleeper()) as follower,
        sidecar(tmp_path, "--pid", str(follower.pid), "--unit", "u0", "--rank", "1") as car,
    ):
        unit = {**unit, "nodes": [unit["nodes"][0], car.url]}
        config = tmp_path / "units.toml"
        config.write_text(units_toml([unit]))
        leader = start_part(tmp_path, "leader", config, "u0:0")
        try:
            stopped, back, killed = await eject_and_readmit(unit, follower)
        finally:
            stop_process(leader.proc)
    print(
        f"\ngateway through the sidecar: SIGSTOP -> unhealthy in {stopped:.3f} s, "
        f"SIGCONT -> healthy in {back:.3f} s, SIGKILL -> unhealthy in {killed:.3f} s"
    )
    assert stopped < 2.0
    assert killed < 1.0


async def eject_and_readmit(
    unit: dict[str, Any], follower: subprocess.Popen[bytes]
) -> tuple[float, float, float]:
    """SIGSTOP, SIGCONT, then SIGKILL the follower; seconds from each signal to the flip."""
    health = {"interval": 0.25, "timeout": 0.2, "fall": 2, "rise": 2}
    async with probed([unit], **health) as p:
        u0 = p.gw.units.units["u0"]
        loop = asyncio.get_running_loop()
        await until(lambda: u0.health is Health.HEALTHY, 3.0, "u0 healthy")
        signalled = loop.time()
        os.kill(follower.pid, signal.SIGSTOP)
        await until(lambda: not u0.healthy, 2.5, "u0 ejected after SIGSTOP")
        stopped = p.flip_time("u0", False) - signalled
        assert p.reason("u0") == f"node 1 (follower {unit['nodes'][1]}): HTTP 503 (status stopped)"
        signalled = loop.time()
        os.kill(follower.pid, signal.SIGCONT)
        await until(lambda: u0.healthy, 2.5, "u0 readmitted after SIGCONT")
        back = p.flip_time("u0", True) - signalled
        signalled = loop.time()
        follower.kill()
        follower.wait(5)  # reaped: gone, not a zombie
        await until(lambda: not u0.healthy, 1.5, "u0 ejected after SIGKILL")
        killed = p.flip_time("u0", False) - signalled
        assert p.reason("u0") == f"node 1 (follower {unit['nodes'][1]}): HTTP 503 (status gone)"
    return stopped, back, killed
