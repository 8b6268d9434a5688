"""vLLM tests: the tiny checkpoint, and the rule for a missing vLLM (skip here, fail in CI)."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.backends.vllm.env import clean_shm
from engine.backends.vllm.tinymodel import write_tiny_model


@pytest.fixture(scope="session")
def no_shm_left_behind() -> Iterator[None]:
    """Whatever shared memory these tests' killed processes leaked (see `clean_shm`)."""
    started = time.time()
    yield
    clean_shm(since=started)


@pytest.fixture(scope="session", autouse=True)
def vllm_sockets_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """vLLM's processes talk over ZMQ sockets it makes in /tmp (`VLLM_RPC_BASE_PATH`) and
    removes only when it shuts down cleanly: the servers these tests kill -9 would leave
    theirs behind. Here they go into the session's own temporary folder."""
    before = os.environ.get("VLLM_RPC_BASE_PATH")
    os.environ["VLLM_RPC_BASE_PATH"] = str(tmp_path_factory.mktemp("vllm-ipc"))
    yield
    if before is None:
        os.environ.pop("VLLM_RPC_BASE_PATH", None)
    else:
        os.environ["VLLM_RPC_BASE_PATH"] = before


@pytest.fixture(scope="session")
def vllm_required(no_shm_left_behind: None) -> None:
    """Locally a missing vLLM skips with the way to get it; in CI it fails, so a broken vLLM
    environment can never turn the suite green by skipping it."""
    if importlib.util.find_spec("vllm") is not None:
        return
    reason = (
        f"vLLM is not installed for {sys.executable}: `make vllm-env` builds .venv-vllm, "
        "and `make test` runs these tests there"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the vLLM tests must run)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
