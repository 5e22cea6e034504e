"""How the platform's commands log (SIS_LOG_FORMAT): `text`, a human-readable line, or `json`,
one JSON object per line for a log collector, with the identifiers of the message a line
concerns (message id, master id, batch, position) as fields of their own.

A log call names what it concerns with `extra=concerning(...)`; the text format leaves the
identifiers to the message, the JSON format adds them as keys. Only those keys are taken from a
record's extras, so a free-text extra never becomes a field.

A message id comes from a broker header, which any producer sets: any length, any characters.
A JSON line is therefore bounded (each identifier, the message and the traceback cut to a
bound, saying how much was cut) and pure ASCII (control characters, line separators and lone
surrogates escaped), so one record is always one line of bounded length a collector can read.
The text format bounds and escapes the message the same way (a traceback, which the platform's
own code writes, keeps its lines), so a hostile id cannot forge a line there either.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The fields a line may carry about the message it concerns, in this order.
IDENTIFIERS = ("message_id", "master_id", "batch", "position")
# The most characters of one identifier, of the message, and of the traceback a JSON line
# carries; what is beyond is cut (`bounded`).
MAX_IDENTIFIER_CHARS = 256
MAX_MESSAGE_CHARS = 4096
MAX_EXCEPTION_CHARS = 16384


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


def bounded(text: str, limit: int) -> str:
    """`text` if it has at most `limit` characters, else its first `limit` characters and a
    note of how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[{len(text) - limit} more characters]"


# What would end or garble a text line: C0 and C1 controls but the tab, DEL, the Unicode line
# and paragraph separators, and lone surrogates (undecodable bytes kept by surrogateescape).
_UNPRINTABLE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` bounded to MAX_MESSAGE_CHARS, with what would end or garble its line escaped
    (`\\n`, `\\x1b`, `\\udcff`)."""
    return _UNPRINTABLE.sub(_escaped, bounded(text, MAX_MESSAGE_CHARS))


def _escaped(found: re.Match[str]) -> str:
    return found.group().encode("unicode_escape", "backslashreplace").decode("ascii")


def _field(value: object) -> object:
    """An identifier as a JSON value: a number as it is, anything else as bounded text."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return bounded(str(value), MAX_IDENTIFIER_CHARS)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one ASCII line of bounded length (module docstring):
    time (UTC, ISO 8601), level, logger, message, the identifiers the record concerns, and the
    exception's traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": bounded(record.getMessage(), MAX_MESSAGE_CHARS),
        }
        for key in IDENTIFIERS:
            value = record.__dict__.get(key)
            if value is not None:
                line[key] = _field(value)
        if record.exc_info:
            trace = self.formatException(record.exc_info)
            if len(trace) > MAX_EXCEPTION_CHARS:  # the end says what was raised: keep it
                cut = len(trace) - MAX_EXCEPTION_CHARS
                trace = f"[{cut} characters cut]...{trace[cut:]}"
            line["exception"] = trace
        return json.dumps(line, ensure_ascii=True)


class TextFormatter(logging.Formatter):
    """The human-readable line (TEXT_FORMAT), its message `printable`."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = printable(record.message)
        return super().formatMessage(record)


def configure_logging(level: str, log_format: str) -> None:
    """The root logger at `level`, writing to stderr in `log_format` (`text` or `json`)."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
