"""Shared-memory cleanup after vLLM nodes (engine/backends/vllm/env.py): what a live process
holds stays, whatever name /proc shows it under. Needs no vLLM: the files are Python's."""

from __future__ import annotations

import glob
import multiprocessing
import os
import time
from multiprocessing.shared_memory import SharedMemory

from engine.backends.vllm.env import clean_shm


def test_a_live_processes_semaphore_is_left_alone() -> None:
    """A spawn-context lock keeps its `sem.mp-*` name (children rebuild it by name), mapped
    under glibc's deleted temporary name: the cleanup must still see it held."""
    started = time.time() - 1
    before = set(glob.glob("/dev/shm/sem.mp-*"))
    lock = multiprocessing.get_context("spawn").Lock()
    (mine,) = set(glob.glob("/dev/shm/sem.mp-*")) - before
    try:
        clean_shm(since=started)
        assert os.path.exists(mine)
    finally:
        del lock


def test_a_file_nobody_holds_goes_and_a_mapped_one_stays() -> None:
    started = time.time() - 1
    held = SharedMemory(create=True, size=4096)
    stale = SharedMemory(create=True, size=4096)
    stale_path = f"/dev/shm/{stale.name.lstrip('/')}"
    stale.close()  # unmapped, still named: what a killed process leaves
    try:
        clean_shm(since=started)
        assert not os.path.exists(stale_path)
        assert os.path.exists(f"/dev/shm/{held.name.lstrip('/')}")
    finally:
        held.close()
        held.unlink()
        if os.path.exists(stale_path):
            stale.unlink()
