"""Building and choosing the native relay: compiled once per source into its cache (a change
to any of its files a new build), a missing or failing compiler named, "auto" falling back to
the Python relay with the reason, "native" refusing to go without it, and UNITGATE_RELAY
overriding the config."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from gateway.config import ConfigError, config_from_dict
from gateway.proxy.upstream import UpstreamClient
from gateway.relay import native


def test_it_builds_once_per_source_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNITGATE_NATIVE_CACHE", str(tmp_path))
    first = native.build()  # with -Wall -Wextra -Werror: a warning would fail it
    assert first.parent == tmp_path and first.name.startswith("_relay-")
    stamp = first.stat().st_mtime_ns
    assert native.build() == first and first.stat().st_mtime_ns == stamp  # reused
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no partial file left


# A compiler that only writes its output: the build's name is what these tests look at.
FAKE_CC = """#!/bin/sh
while [ $# -gt 0 ]; do
    if [ "$1" = -o ]; then : > "$2"; fi
    shift
done
"""


def test_a_change_to_any_of_its_files_builds_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """relay.c is compiled alone and includes the others: each of them is in the cache key."""
    sources = tmp_path / "native"
    sources.mkdir()
    for path in (native.SOURCE, *native.parts()):
        shutil.copy(path, sources / path.name)
    cc = tmp_path / "cc"
    cc.write_text(FAKE_CC)
    cc.chmod(0o755)
    monkeypatch.setattr(native, "SOURCE", sources / "relay.c")
    monkeypatch.setenv("UNITGATE_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(cc))
    parts = native.parts()
    assert {p.name for p in parts} >= {"relay.h", "framing.c", "events.c", "reader.c", "tap.c"}
    built = [native.build()]
    assert native.build() == built[0]  # unchanged: the same build
    for part in parts:
        part.write_text(part.read_text() + "\n/* changed */\n")
        built.append(native.build())
    assert len(set(built)) == len(parts) + 1 and all(path.exists() for path in built)


def test_every_file_the_source_includes_is_in_the_key() -> None:
    names = {path.name for path in native.parts()}
    for path in (native.SOURCE, *native.parts()):
        included = set(re.findall(r'^#include "([^"]+)"', path.read_text(), re.MULTILINE))
        assert included <= names, path.name


def test_a_missing_or_failing_compiler_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNITGATE_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    with pytest.raises(native.NativeUnavailable, match="CC='no-such-compiler' is not found"):
        native.build()
    monkeypatch.setenv("CC", "false")  # found, and fails
    with pytest.raises(native.NativeUnavailable, match="failed"):
        native.build()
    assert not os.listdir(tmp_path)


def test_auto_falls_back_with_the_reason_and_native_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNITGATE_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.delenv(native.ENV, raising=False)
    native.module.cache_clear()
    try:
        mod, why = native.resolve("auto")
        assert mod is None and why is not None
        assert "relaying in Python" in why and "no-such-compiler" in why
        with pytest.raises(native.NativeUnavailable, match="no-such-compiler"):
            native.resolve("native")
        assert native.resolve("python") == (None, None)
    finally:
        native.module.cache_clear()  # the next caller builds (or finds) the real one


def test_the_environment_overrides_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_from_dict({"upstream": {"relay": "python"}})
    monkeypatch.setenv(native.ENV, "native")
    assert UpstreamClient(config).native is native.module()
    monkeypatch.setenv(native.ENV, "python")
    assert UpstreamClient(config_from_dict({})).native is None
    monkeypatch.setenv(native.ENV, "fast")
    with pytest.raises(ValueError, match="UNITGATE_RELAY = 'fast': must be one of"):
        native.resolve("auto")


def test_a_bad_relay_in_the_config_names_the_key() -> None:
    with pytest.raises(ConfigError, match="relay"):
        config_from_dict({"upstream": {"relay": "rust"}})
