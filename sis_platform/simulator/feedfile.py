"""Feed files: a simulated feed as JSON lines, one message a line.

Each line is `{"message_id": ..., "body_b64": ..., "kind": ..., "sent": ...}`: the body in
base64 because bodies are bytes and may be deliberately broken UTF-8, `sent` as ISO 8601 with
its UTC offset. Reading and writing both stream, so a file of a million messages never has to
fit in memory.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import IO

from sis_platform.simulator.generator import SimulatedMessage


class FeedFileError(ValueError):
    """A feed file line that is not a simulated message."""


def encode_line(message: SimulatedMessage) -> str:
    record = {
        "message_id": message.message_id,
        "body_b64": base64.b64encode(message.body).decode("ascii"),
        "kind": message.kind,
        "sent": message.sent.isoformat(),
    }
    return json.dumps(record, separators=(",", ":")) + "\n"


def decode_line(line: str, *, where: str = "line") -> SimulatedMessage:
    try:
        record = json.loads(line)
        if not isinstance(record, dict):
            raise TypeError("not a JSON object")
        sent = datetime.fromisoformat(record["sent"])
        if sent.tzinfo is None:
            raise ValueError("sent has no UTC offset")
        return SimulatedMessage(
            message_id=str(record["message_id"]),
            body=base64.b64decode(record["body_b64"], validate=True),
            kind=str(record["kind"]),
            sent=sent,
        )
    except (ValueError, KeyError, TypeError, binascii.Error) as error:
        raise FeedFileError(f"{where}: not a simulated message ({error})") from None


def write_stream(messages: Iterable[SimulatedMessage], out: IO[str]) -> int:
    """Write messages to an open text stream; returns how many were written."""
    count = 0
    for message in messages:
        out.write(encode_line(message))
        count += 1
    return count


def write_feed(messages: Iterable[SimulatedMessage], path: str | Path) -> int:
    """Write messages to `path` (replaced if it exists); returns how many were written."""
    with open(path, "w", encoding="utf-8", newline="\n") as out:
        return write_stream(messages, out)


def read_stream(lines: Iterable[str], *, name: str = "<stream>") -> Iterator[SimulatedMessage]:
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield decode_line(line, where=f"{name}:{number}")


def read_feed(path: str | Path) -> Iterator[SimulatedMessage]:
    """Yield the messages of a feed file in file order (blank lines are ignored)."""
    with open(path, encoding="utf-8") as lines:
        yield from read_stream(lines, name=str(path))
