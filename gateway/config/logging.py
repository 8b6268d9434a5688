"""Settings of the gateway's logs: their format, and the per-request access log."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.checks import check

LOG_FORMATS = ("text", "json")


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    # One line per request under the logger `unitgate.access` (observability/access_log.py);
    # off: nothing subscribes, so the request path pays nothing for it.
    access: bool = False
    # text: human-readable lines; json: one JSON object per line (observability/logformat.py).
    # `--log-format` on the command line wins over this.
    format: str = "text"

    def __post_init__(self) -> None:
        check(self.format in LOG_FORMATS, "format", self.format, f"must be one of {LOG_FORMATS}")
