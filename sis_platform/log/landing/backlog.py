"""What the lake has still to fold: the messages landed after the fold's position, and when the
oldest of them landed (the lake lag check, assets/masters.py).

The fold folds whole batches in order (lake/spark/fold/plan.py), so what it has not folded is every
landed batch after the last one it committed, and the open batch a resident consumer is filling
(its messages are landed, durable, and waiting for the batch to be sealed). The oldest of them
is the first message of the first such batch. Read from the landing zone alone: the listing, an
anchor per waiting batch (its message count) and one column of one file, so its cost does not
grow with the log.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow.compute as pc
import pyarrow.parquet as pq

from sis_platform.log.landing.catalog import Catalog
from sis_platform.log.landing.rows import OpenBatch, batch_key


@dataclass(frozen=True)
class Backlog:
    """The landed messages the fold has not folded."""

    folded_through: int  # the last batch the fold has committed (0: none)
    batches: int  # sealed batches after it (an open batch not counted)
    messages: int  # messages in those batches and in the open batch
    oldest_landed_at: datetime | None  # UTC: when the oldest of them landed (None: none wait)
    open_batch: bool = False  # a batch being landed in parts holds some of them

    def lag_seconds(self, now: datetime) -> float:
        """How long the oldest waiting message has waited at `now` (0 when none waits)."""
        if self.oldest_landed_at is None:
            return 0.0
        return max(0.0, (now - self.oldest_landed_at).total_seconds())


def backlog_after(zone: Catalog, folded_through: int) -> Backlog:
    """The messages landed in `zone` after batch `folded_through`, open batch included."""
    waiting = zone.keys_after(folded_through)
    messages = sum(_messages(zone, key) for key in waiting)
    open_batch = zone.tail().open
    in_open = open_batch is not None and open_batch.seq > folded_through
    if open_batch is not None and in_open:
        messages += open_batch.messages
    oldest = _oldest(zone, waiting, open_batch, folded_through)
    return Backlog(folded_through, len(waiting), messages, oldest, in_open)


def oldest_waiting(
    zone: Catalog, folded_through: int, open_batch: OpenBatch | None
) -> datetime | None:
    """When the oldest message landed after batch `folded_through` landed (None: none), as
    `backlog_after` finds it, with the open batch its writer holds (no tail read): one listing
    of the zone and one column of one file, whatever the backlog."""
    return _oldest(zone, zone.keys_after(folded_through), open_batch, folded_through)


def _oldest(
    zone: Catalog, waiting: list[str], open_batch: OpenBatch | None, folded_through: int
) -> datetime | None:
    """The first message of the first sealed batch waiting, else the open batch's opening."""
    oldest = _first_landed_at(zone, waiting[0]) if waiting else None
    if oldest is None and open_batch is not None and open_batch.seq > folded_through:
        oldest = open_batch.opened_at.astimezone(UTC)
    return oldest


def landed_messages(zone: Catalog, seq: int) -> int | None:
    """How many messages batch `seq` holds (None: no such batch landed). The dead-letter rate's
    denominator: a batch logs exactly the messages it landed."""
    key = batch_key(seq)
    if zone.anchors.read(key) is None and not zone.batch_files(key):
        return None
    return _messages(zone, key)


def _messages(zone: Catalog, key: str) -> int:
    """A sealed batch's message count: its anchor's, else its files' row counts (a one-file
    batch whose anchor a crash has not yet let it write)."""
    anchor = zone.anchors.read(key)
    if anchor is not None:
        return anchor.messages
    return sum(pq.ParquetFile(path).metadata.num_rows for path in zone.batch_files(key))


def _first_landed_at(zone: Catalog, key: str) -> datetime | None:
    """When the first message of batch `key` landed: the earliest `received_at` of its first
    file (a batch's files are in landing order)."""
    files = zone.batch_files(key)
    if not files:
        return None
    earliest = pc.min(pq.read_table(files[0], columns=["received_at"]).column("received_at"))
    value = earliest.as_py()
    if value is None:
        return None
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
