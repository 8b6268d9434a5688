"""Fixtures shared by the engine's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.model import kernels


@pytest.fixture
def no_compiler(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As on a machine without a C compiler: no optional kernel builds (`kernels.builds`)."""

    def unavailable(name: str) -> None:
        raise kernels.KernelUnavailable(f"no C compiler for the {name} kernel")

    monkeypatch.setattr(kernels, "optional_library", unavailable)
    kernels.builds.cache_clear()
    yield
    kernels.builds.cache_clear()
