"""The gateway's log lines, as text (the default) or as one JSON object per line.

Both formats carry a record's structured extras (`log.info(..., extra={"status": 200})`): the
JSON one as fields of its object, the text one as `key=value` after the message. Every process
that logs (the gateway, its workers, `up`'s replicas) sets its handler up here, once, so a
format chosen on the command line or in `[logging] format` holds in all of them.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# What every LogRecord has: anything else on a record came from `extra=`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


def extras(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a log call added with `extra=`, in the order it gave them."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    """time (ISO 8601, UTC), level, logger, message, then the extras; `exception` holds a
    traceback, `process` names the process kind (a worker, a replica) where one is set."""

    def __init__(self, process: str | None = None) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.process is not None:
            entry["process"] = self.process
        for key, value in extras(record).items():
            entry.setdefault(key, value)  # an extra never overwrites the fields above
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    """The classic line, with the record's extras appended as `key=value` (None as `-`)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        fields = extras(record)
        if not fields:
            return line
        return line + " " + " ".join(f"{k}={_text(v)}" for k, v in fields.items())


class _Handler(logging.StreamHandler[TextIO]):
    """The one handler `setup` installs (so a second call replaces it, and only it)."""


def setup(level: str, fmt: str, text_format: str = TEXT_FORMAT, process: str | None = None) -> None:
    """Route every log line to stderr in `fmt` ("text" or "json") at `level` (a name such as
    "info"); a second call replaces the handler the first one installed."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    handler = _Handler(sys.stderr)
    handler.setFormatter(JsonFormatter(process) if fmt == "json" else TextFormatter(text_format))
    root.addHandler(handler)
    root.setLevel(level.upper())


def current_format() -> str:
    """The format the root logger's handlers write ("json" or "text"): what a child process
    (a worker) is started with, as it is started with the current level."""
    ours = [h for h in logging.getLogger().handlers if isinstance(h, _Handler)]
    return "json" if any(isinstance(h.formatter, JsonFormatter) for h in ours) else "text"


def _iso(created: float) -> str:
    stamp = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    return orjson.dumps(text).decode() if not text or " " in text or '"' in text else text
