"""`unitgate --version`, `unitgate check-config`, and `unitgate gateway` with a bad config,
run as an operator runs them: a subprocess, its exit code and its output."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from gateway.version import version
from tests.support import ROOT

BAD = """
[gateway]
port = 70000
prot = 1

[timeouts]
total = -1

[[units]]
id = "u0"
"""


def unitgate(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("UNITGATE__")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_version_is_the_package_version() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version() == pyproject
    for flag in ("--version", "-V"):
        done = unitgate(flag)
        assert (done.returncode, done.stdout, done.stderr) == (0, f"unitgate {pyproject}\n", "")


def test_check_config_lists_every_error_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(BAD)
    done = unitgate("check-config", str(path), UNITGATE__TIMEOUTS__IDLE="-5")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"unitgate: {path}: unknown key [gateway].prot; known keys: "
        + done.stderr.split("known keys: ")[1].splitlines()[0],
        f"unitgate: {path}: [gateway].port must be 0..65535 (0 = any free port), got 70000",
        f"unitgate: {path}: [timeouts].idle must be a positive number, got -5.0"
        " (from UNITGATE__TIMEOUTS__IDLE)",
        f"unitgate: {path}: [timeouts].total must be a positive number, got -1.0",
        f"unitgate: {path}: missing required key [units][0].leader",
        f"unitgate: 5 errors in {path}",
    ]


def test_check_config_ok_summarises(tmp_path: Path) -> None:
    done = unitgate(
        "check-config",
        str(ROOT / "config.toml"),
        UNITGATE__GATEWAY__PORT="9000",
        UNITGATE__UNITS__1__LEADER="http://10.0.0.5:8101",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"ok: {ROOT / 'config.toml'}"
    assert "127.0.0.1:9000" in done.stdout and "2 (u0, u1)" in done.stdout
    assert lines[-1] == (
        "  environment overrides: UNITGATE__GATEWAY__PORT, UNITGATE__UNITS__1__LEADER"
    )
    missing = unitgate("check-config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2
    assert f"{tmp_path / 'nope.toml'}: config file not found" in missing.stderr


def test_gateway_with_a_bad_config_prints_every_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(BAD)
    done = unitgate("gateway", "--config", str(path))
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 4 and all(line.startswith(f"unitgate: {path}: ") for line in lines)
    assert "[timeouts].total" in lines[2] and "[units][0].leader" in lines[3]
