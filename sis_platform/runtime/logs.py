"""How the platform's commands log (SIS_LOG_FORMAT): `text`, a human-readable line, or `json`,
one JSON object per line for a log collector, with the identifiers of the message a line
concerns (message id, master id, batch, position) as fields of their own.

A log call names what it concerns with `extra=concerning(...)`; the text format leaves the
identifiers to the message, the JSON format adds them as keys. Only those keys are taken from a
record's extras, so a free-text extra never becomes a field.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The fields a line may carry about the message it concerns, in this order.
IDENTIFIERS = ("message_id", "master_id", "batch", "position")


def concerning(
    *,
    message_id: str | None = None,
    master_id: str | None = None,
    batch: str | int | None = None,
    position: int | None = None,
) -> dict[str, Any]:
    """The `extra` of a log call about one message, master or batch (None: not known)."""
    given = {"message_id": message_id, "master_id": master_id, "batch": batch}
    given["position"] = position
    return {k: v for k, v in given.items() if v is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: time (UTC, ISO 8601), level, logger, message,
    the identifiers the record concerns, and the exception's traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in IDENTIFIERS:
            value = record.__dict__.get(key)
            if value is not None:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str) -> None:
    """The root logger at `level`, writing to stderr in `log_format` (`text` or `json`)."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
