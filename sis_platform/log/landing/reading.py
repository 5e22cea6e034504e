"""Reading the log back from a position: `landed_after`, the messages landed after a
`LogPosition`, in log order, as the domain fold consumes them (`LoggedMessage`).

Only the files at and after the position are opened: batch numbers are probed one after the
other from the position's batch (the zone is never listed), a one-file batch ending at or
before the position is passed over on its footer's row count, and in a batch in parts the first
part to read is found by bisection on the parts' running message counts (footers only).
Reading stops at the first batch number with no file and no part: the end of the log, or a
batch removed from it (which `sis-verify-log` reports).

A body moved aside at intake stays aside unless it fits the limits now (then it is read back
from its overflow file, `Catalog.restored_body`), as message_items reads it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from sis_platform.domain.limits import Limits
from sis_platform.domain.pipeline import LoggedMessage
from sis_platform.log.landing.rows import MESSAGES_KEY, READ_ROWS, LogPosition, batch_key

if TYPE_CHECKING:
    from sis_platform.log.landing.catalog import Catalog

_COLUMNS = [
    "batch_seq",
    "msg_seq",
    "message_id",
    "put_time",
    "delivery_count",
    "body",
    "body_size",
    "body_sha256",
    "body_location",
]


@dataclass(frozen=True)
class LandedMessage:
    """One landed message read back for a fold: where it is in the log, the message as the
    domain fold takes it, and its put time on the queue."""

    position: LogPosition
    message: LoggedMessage
    put_time: datetime | None


def landed_after(zone: Catalog, position: LogPosition, limits: Limits) -> Iterator[LandedMessage]:
    """Every landed message after `position` (open batch included), in log order."""
    seq = max(position.batch_seq, 1)
    after = position.msg_seq if position.batch_seq >= 1 else -1
    while True:
        files = zone.batch_files(batch_key(seq))
        if not files:
            return
        for path in _files_after(files, after):
            yield from _read_file(zone, path, after, limits)
        seq += 1
        after = -1


def _files_after(files: list[Path], after: int) -> list[Path]:
    """The files of one batch that hold a message after position `after` in it."""
    if after < 0:
        return files
    if len(files) == 1:
        rows = pq.ParquetFile(files[0]).metadata.num_rows
        # A one-file batch numbers its rows 0..rows-1; a lone part carries its running count.
        return files if _running_count(files[0], rows) > after + 1 else []
    first = bisect.bisect_right(files, after + 1, key=lambda p: _running_count(p, None))
    return files[first:]


def _running_count(path: Path, default: int | None) -> int:
    """The messages of the batch up to and including this file (a part's running count, a
    one-file batch's row count)."""
    metadata = pq.read_schema(path).metadata or {}
    raw = metadata.get(MESSAGES_KEY)
    if raw is not None:
        return int(raw)
    if default is None:
        raise ValueError(f"{path} carries no message count in its metadata")
    return default


def _read_file(zone: Catalog, path: Path, after: int, limits: Limits) -> Iterator[LandedMessage]:
    for batch in pq.ParquetFile(path).iter_batches(batch_size=READ_ROWS, columns=_COLUMNS):
        rows = batch.to_pydict()
        for i, msg_seq in enumerate(rows["msg_seq"]):
            if msg_seq <= after:
                continue
            batch_seq = int(rows["batch_seq"][i])
            message = _logged(
                zone,
                batch_seq,
                str(rows["message_id"][i]),
                int(rows["delivery_count"][i]),
                rows["body"][i],
                rows["body_location"][i],
                rows["body_size"][i],
                rows["body_sha256"][i],
                limits,
            )
            yield LandedMessage(
                LogPosition(batch_seq, int(msg_seq)),
                message,
                rows["put_time"][i],
            )


def _logged(
    zone: Catalog,
    batch_seq: int,
    message_id: str,
    delivery_count: int,
    body: bytes | None,
    location: str | None,
    size: int,
    sha256: str,
    limits: Limits,
) -> LoggedMessage:
    if location is None:
        return LoggedMessage(message_id, body or b"", delivery_count, batch_seq=batch_seq)
    restored = zone.restored_body(location, int(size), str(sha256), limits.max_message_bytes)
    if restored is None:
        return LoggedMessage(
            message_id, b"", delivery_count, int(size), location, batch_seq=batch_seq
        )
    return LoggedMessage(message_id, restored, delivery_count, batch_seq=batch_seq)
