"""The wheel, built from a copy of the sources as the image builds it: the gateway, the engine,
the load generator and the simulated units, their data files, and no benchmarks (they run from
a checkout, `make bench`). A build takes a few seconds, without network (no build isolation)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest

from gateway.launcher.cli import _DELEGATED
from tests.deploy.manifests import ROOT

SOURCES = ("pyproject.toml", "README.md", "gateway", "engine", "loadtest")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The names in a wheel of the working tree (copied, so the build leaves no trace in it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in SOURCES:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(origin, src / name)
    offline = ("--no-deps", "--no-build-isolation", "--no-index")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", *offline, "-w", str(tmp / "out"), str(src)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (found,) = (tmp / "out").glob("unitgate-*.whl")
    with zipfile.ZipFile(found) as archive:
        return archive.namelist()


def test_the_benchmarks_are_not_in_the_wheel(wheel: list[str]) -> None:
    assert [name for name in wheel if name.startswith("loadtest/bench")] == []
    assert any(name.startswith("loadtest/gen/") for name in wheel)


def test_no_shipped_module_imports_a_benchmark(wheel: list[str]) -> None:
    for name in wheel:
        if name.endswith(".py"):
            text = (ROOT / name).read_text(encoding="utf-8")
            assert "import loadtest.bench" not in text, name
            assert "from loadtest.bench" not in text, name


def test_every_command_and_data_file_ships(wheel: list[str]) -> None:
    names = set(wheel)
    for module in {*_DELEGATED.values(), "gateway.launcher.cli"}:
        path = module.replace(".", "/")
        assert f"{path}.py" in names or f"{path}/__init__.py" in names, module
    static = [p.relative_to(ROOT).as_posix() for p in (ROOT / "gateway/status/static").iterdir()]
    assert static and set(static) <= names  # the status page
    for folder in ("engine/model/kernels", "gateway/relay/native"):
        sources = [p.relative_to(ROOT).as_posix() for p in (ROOT / folder).glob("*.[ch]")]
        assert sources and set(sources) <= names, folder  # compiled at set-up or first use
    assert any(n.endswith(".dist-info/entry_points.txt") for n in names)
