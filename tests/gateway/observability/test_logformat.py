"""The log line formats: JSON objects (one per line) and text with its extras, as set up."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.config import ConfigError, config_from_dict
from gateway.launcher.up.fleet import ReplicaPorts
from gateway.launcher.up.replica import _parser as replica_parser
from gateway.launcher.up.replicas import ReplicaLauncher
from gateway.observability.logformat import (
    JsonFormatter,
    TextFormatter,
    current_format,
    extras,
    setup,
)


def record(msg: str = "unit %s is %s", *args: object, **extra: object) -> logging.LogRecord:
    """A record made as `log.warning(msg, *args, extra=extra)` would make it."""
    logger = logging.getLogger("unitgate.test")
    rec = logger.makeRecord(
        logger.name, logging.WARNING, __file__, 1, msg, args or ("u0", "dead"), None
    )
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_a_json_line_has_time_level_logger_message_and_the_extras() -> None:
    rec = record(request_id="r1", status=502, ttft=None)
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    entry = json.loads(line)
    assert list(entry)[:4] == ["time", "level", "logger", "message"]
    assert entry["level"] == "WARNING" and entry["logger"] == "unitgate.test"
    assert entry["message"] == "unit u0 is dead"
    assert (entry["request_id"], entry["status"], entry["ttft"]) == ("r1", 502, None)
    assert entry["time"].endswith("Z")  # UTC, ISO 8601, milliseconds
    when = datetime.fromisoformat(entry["time"])
    assert when.utcoffset() == UTC.utcoffset(None)
    assert abs(when.timestamp() - rec.created) < 0.001
    assert "exception" not in entry and "process" not in entry


def test_a_json_line_carries_the_exception_as_a_field() -> None:
    try:
        raise ConnectionRefusedError(111, "Connection refused")
    except ConnectionRefusedError:
        rec = record()
        rec.exc_info = sys.exc_info()
    entry = json.loads(JsonFormatter().format(rec))
    assert entry["message"] == "unit u0 is dead"  # the traceback is not in the message
    assert entry["exception"].startswith("Traceback (most recent call last):")
    assert "ConnectionRefusedError: [Errno 111] Connection refused" in entry["exception"]


def test_json_extras_never_overwrite_the_fixed_fields_and_odd_values_become_text() -> None:
    rec = record(level="sneaky", path=Path("/var/log/x"), unit="u0")
    entry = json.loads(JsonFormatter(process="worker").format(rec))
    assert entry["level"] == "WARNING" and entry["unit"] == "u0"
    assert entry["process"] == "worker"
    assert entry["path"] == "/var/log/x"  # what orjson cannot encode, as str() says it


def test_extras_are_only_what_the_call_added() -> None:
    assert extras(record()) == {}
    assert extras(record(b=1, a=2)) == {"b": 1, "a": 2}


def test_a_text_line_appends_the_extras_as_key_value() -> None:
    formatter = TextFormatter("%(levelname)s %(name)s: %(message)s")
    assert formatter.format(record()) == "WARNING unitgate.test: unit u0 is dead"
    line = formatter.format(record(request_id="r1", ttft=None, duration=0.25, note="a b"))
    fields = 'request_id=r1 ttft=- duration=0.25 note="a b"'  # None as -, quoted if spaced
    assert line == f"WARNING unitgate.test: unit u0 is dead {fields}"


@pytest.fixture
def root() -> Iterator[logging.Logger]:
    """The root logger, given back as it was (pytest's capture handlers included)."""
    logger = logging.getLogger()
    handlers, level = logger.handlers[:], logger.level
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)


def test_setup_switches_the_whole_process_and_says_which_format_it_set(
    root: logging.Logger,
) -> None:
    before = root.handlers[:]  # pytest's own: kept
    setup("warning", "json", process="replica 1")
    assert current_format() == "json" and root.level == logging.WARNING
    (ours,) = [h for h in root.handlers if h not in before]
    stream = io.StringIO()
    assert isinstance(ours, logging.StreamHandler)
    ours.setStream(stream)
    logging.getLogger("unitgate.x").info("hidden")
    logging.getLogger("unitgate.x").warning("shown %d", 1, extra={"unit": "u0"})
    lines = stream.getvalue().splitlines()
    assert [json.loads(line)["message"] for line in lines] == ["shown 1"]
    assert json.loads(lines[0])["process"] == "replica 1"
    setup("info", "text")  # replaces its own handler, and only it
    assert current_format() == "text" and len(root.handlers) == len(before) + 1
    assert ours not in root.handlers and all(h in root.handlers for h in before)


def test_the_logging_section_is_checked_and_defaults_to_text_without_access() -> None:
    config = config_from_dict({})
    assert (config.logging.format, config.logging.access) == ("text", False)
    with pytest.raises(ConfigError, match=r"\[logging\]\.format .*'xml'"):
        config_from_dict({"logging": {"format": "xml"}})
    assert config_from_dict({"logging": {"format": "json", "access": True}}).logging.access


def test_the_format_is_handed_down_to_up_s_replicas() -> None:
    """`unitgate up --replicas N --log-format json`: each replica is started with the format,
    and the replica's own command line takes it."""
    launcher = ReplicaLauncher(Path("up.toml"), Path("logs"), {}, "info", 30.0, None, "json")
    argv = launcher.argv(ReplicaPorts(1, 9000, 9001))
    assert argv[argv.index("--log-format") + 1] == "json"
    ns = replica_parser().parse_args(argv[argv.index("replica") + 1 :])
    assert ns.log_format == "json"
