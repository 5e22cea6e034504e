"""Landing expiry: sealed batches removed from the landing zone once they are older than the
retention (SIS_LANDING_RETAIN_DAYS) and the lake has folded and checked them, never before.

The landing zone is the intake's durable buffer; the lake's `raw_messages` table is the system
of record of the message log and keeps every message after its batch leaves the zone. A batch is
expired only when all of these hold:
- it is at or before the serving store's live == lake gate (`Retention.checked_batch`: the batch
  at which `live_matches_lake` last passed, which the lake can only reach by folding every batch
  up to it from `raw_messages`, whose chain check blocks the fold);
- it is one file (merged, or landed whole), with no parts folder left from its merge;
- its last message was received more than the retention before the newest sealed batch's last
  message (the log's own clock: the host's clock stepped back expires nothing early, an idle feed
  expires nothing);
- it is not the newest sealed batch (the log's tail and the next batch's first link stay in the
  zone's own files).

The expiry record `expired.json` at the zone's root holds the anchor of the last expired batch
(signed with the log key, as every anchor is): the head the first kept batch links to, and the
log position before which the zone no longer has messages. Expiring is write-ahead:
1. the record is replaced (written beside it, fsync'd, renamed, the folder fsync'd) under the
   consumer lease's fence, and only ever moves forward;
2. then the batches up to it are removed, oldest first, each its file and then its anchor.
A crash between or during the removals leaves batches the record already covers: readers
treat every batch at or before it as gone (`keys` skips them, reading one raises
`BatchExpired`), and the next turn removes the rest. Crash points `expire.after_record`,
`expire.mid_removal`.

What asks for an expired batch gets a clear error instead of a silent gap: sis-live restarted on
a serving store older than the record (`LogExpired`: restore a newer backup of the store), and a
re-materialization of an expired batch's `raw_messages` (`BatchExpired`: its rows are in the
lake). Run by sis-live in its idle turns (`Expirer`), after the merge.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pyarrow.parquet as pq

from sis_platform.log.chain import Anchor, anchor_json, fsync_dir, write_durably
from sis_platform.log.landing.rows import batch_key, batch_seq_of
from sis_platform.log.position import LogPosition
from sis_platform.runtime.faults import crash_point

if TYPE_CHECKING:
    from sis_platform.intake.lease import Fence
    from sis_platform.log.landing.layout import ZoneLayout

log = logging.getLogger(__name__)

EXPIRY_RECORD = "expired.json"
# The time one idle turn of sis-live spends removing expired batches (one batch at least).
TURN_SECONDS = 0.05
# How often sis-live looks for batches to expire once none was left (while some are left, it
# removes more every idle turn): a batch is sealed every two minutes at the defaults.
CHECK_SECONDS = 60.0
# The most batches one look considers (a file footer read each, within an idle turn): a zone
# expired for the first time catches up over as many turns as it needs.
LOOK_BATCHES = 30


class BatchExpired(FileNotFoundError):
    """A batch asked for was expired from the landing zone; its messages are in the lake."""


class LogExpired(LookupError):
    """A reader asked for the log from a position the landing zone no longer holds."""


@dataclass(frozen=True)
class Expiry:
    """What the expiry record says: batches up to and including `anchor`'s are expired."""

    anchor: Anchor

    @property
    def through_seq(self) -> int:
        return batch_seq_of(self.anchor.batch_key)

    @property
    def end(self) -> LogPosition:
        """The position of the last expired message: a reader must be at or after it."""
        return LogPosition(self.through_seq, self.anchor.messages - 1)

    def covers(self, key: str) -> bool:
        return batch_seq_of(key) <= self.through_seq


def read_expiry(root: Path) -> Expiry | None:
    """The zone's expiry record; None when nothing was expired. A file that is not a record
    raises ValueError: a zone whose record is unreadable must not be read as if whole."""
    path = root / EXPIRY_RECORD
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return Expiry(Anchor.from_json(json.loads(raw)["anchor"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"the expiry record {path} is not an expiry record: {exc}") from exc


def reading_from(zone: ZoneLayout, position: LogPosition) -> LogPosition:
    """Where a reader of `zone` after `position` starts: `position` itself, or, at the end of
    the expired batches, before the first kept batch. LogExpired when messages after
    `position` were expired: a reader there would skip them."""
    expiry = zone.expiry()
    if expiry is None:
        return position
    if position == expiry.end:
        return LogPosition(expiry.through_seq + 1, -1)
    if position < expiry.end:
        raise LogExpired(
            f"the landing zone {zone.root} no longer holds the log after position "
            f"{tuple(position)}: batches up to {expiry.anchor.batch_key} expired "
            f"(SIS_LANDING_RETAIN_DAYS; their messages are in the lake's raw_messages). A "
            "serving store this old cannot catch up from the landing zone: restore a newer "
            "backup of it"
        )
    return position


def _write_record(zone: ZoneLayout, anchor: Anchor) -> None:
    """Replace the expiry record durably with one naming `anchor`."""
    zone.ensure()
    record = b'{"anchor": ' + anchor_json(anchor).rstrip() + b"}\n"
    write_durably(zone.root / EXPIRY_RECORD, record, replace=True)


class Advance(NamedTuple):
    """One look's outcome: the batch the record now reaches (0: none), and whether batches
    beyond the look's bound may be expirable too."""

    through_seq: int
    more: bool


def advance_record(
    zone: ZoneLayout,
    checked_batch: int,
    retain_seconds: float,
    fence: Fence | None = None,
    *,
    look: int = LOOK_BATCHES,
) -> Advance:
    """Step 1: move the record forward to the last batch the rules in the module docstring let
    go, looking at most `look` batches past the record."""
    expiry = zone.expiry()
    start = expiry.through_seq if expiry is not None else 0
    newest = _newest_sealed(zone)
    if newest is None:
        return Advance(start, False)
    newest_seq, newest_at = newest
    last = min(checked_batch, newest_seq - 1, start + look)
    through = start
    for seq in range(start + 1, last + 1):
        received = _last_received(zone, batch_key(seq))
        if received is None or (newest_at - received).total_seconds() <= retain_seconds:
            break
        through = seq
    if through == start:
        return Advance(start, False)
    anchor = zone.anchors.read(batch_key(through))
    if anchor is None:
        return Advance(start, False)
    with fence.held() if fence is not None else contextlib.nullcontext():
        current = zone.expiry()
        if current is not None and current.through_seq >= through:
            return Advance(current.through_seq, False)  # another holder moved it meanwhile
        _write_record(zone, anchor)
    crash_point("expire.after_record")
    return Advance(through, through == start + look)


def remove_expired(zone: ZoneLayout, deadline: float | None = None) -> bool:
    """Step 2: remove what the record covers and the zone still holds, oldest first (file,
    then anchor), stopping once `time.monotonic()` passes `deadline` (after one batch at
    least). True when nothing covered is left."""
    expiry = zone.expiry()
    if expiry is None:
        return True
    removed = 0
    for key in _covered(zone, expiry):
        if removed > 0 and deadline is not None and time.monotonic() > deadline:
            return False
        _remove_batch(zone, key, crash_between=removed == 1)
        removed += 1
    if removed:
        fsync_dir(zone.anchors.dir)
    return True


def expire_through(zone: ZoneLayout, anchor: Anchor) -> None:
    """Expire every batch up to and including `anchor`'s at once, without the rules above: the
    record moved to `anchor`, then every covered batch the zone holds removed, oldest first
    (file, then anchor). For a zone whose record jumps over batches it never held, such as a
    season's history built in bulk (scripts/bench_season.py); sis-live's `Expirer` moves the
    record a batch at a time instead, and only as far as the rules allow. The caller holds the
    zone (no fence); the record only moves forward (ValueError otherwise)."""
    through = batch_seq_of(anchor.batch_key)
    current = zone.expiry()
    if current is not None and current.through_seq >= through:
        raise ValueError(
            f"the expiry record is at batch {current.anchor.batch_key} already: it cannot move "
            f"back to {anchor.batch_key}"
        )
    _write_record(zone, anchor)
    crash_point("expire.after_record")
    for key in zone.anchors.keys():
        if batch_seq_of(key) <= through:
            _remove_batch(zone, key)
    fsync_dir(zone.anchors.dir)


def _remove_batch(zone: ZoneLayout, key: str, *, crash_between: bool = False) -> None:
    """Remove an expired batch: its file (durably), then its anchor, so a crash between the two
    leaves the anchor of a batch whose file is gone, which the record already covers.
    `crash_between`: the crash point `expire.mid_removal` lies between the two."""
    zone.batch_path(key).unlink(missing_ok=True)
    fsync_dir(zone.batches_dir)
    if crash_between:
        crash_point("expire.mid_removal")
    zone.anchors.path(key).unlink(missing_ok=True)


def _covered(zone: ZoneLayout, expiry: Expiry) -> list[str]:
    """The batches the record covers that still have a file or an anchor, in order, found by
    probing down from the record's batch: removal goes oldest first, so what is left of the
    covered batches is the run just below the record (the cost is the batches left, never the
    size of the zone)."""
    left: list[str] = []
    seq = expiry.through_seq
    while seq >= 1:
        key = batch_key(seq)
        if not (zone.batch_path(key).is_file() or zone.anchors.path(key).exists()):
            break
        left.append(key)
        seq -= 1
    return left[::-1]


def _newest_sealed(zone: ZoneLayout) -> tuple[int, datetime] | None:
    """The newest sealed batch's number and its last message's receipt time."""
    keys = zone.anchors.keys()
    for key in reversed(keys):
        received = _last_received(zone, key)
        if received is not None:
            return batch_seq_of(key), received
    return None


def _last_received(zone: ZoneLayout, key: str) -> datetime | None:
    """When batch `key`'s last message was received (from its file footer's statistics when it
    has them), None unless it is one file with no parts folder left: a batch in parts is
    neither merged nor ever expired."""
    path = zone.batch_path(key)
    if not path.is_file() or zone.batch_dir(key).exists():
        return None
    metadata = pq.ParquetFile(path).metadata
    column = metadata.schema.to_arrow_schema().get_field_index("received_at")
    latest: datetime | None = None
    for i in range(metadata.num_row_groups):
        stats = metadata.row_group(i).column(column).statistics
        if stats is None or not stats.has_min_max:
            values = pq.read_table(path, columns=["received_at"]).column(0)
            return max((v for v in values.to_pylist() if v is not None), default=None)
        high = stats.max
        latest = high if latest is None or high > latest else latest
    return latest


class Expirer:
    """sis-live's expiry, a bounded step per idle turn (`turn`): a look for batches to expire at
    most every `check_seconds` (every turn while a look found more), then removals within the
    turn's budget."""

    def __init__(
        self,
        zone: ZoneLayout,
        fence: Fence | None,
        retain_seconds: float,
        *,
        check_seconds: float = CHECK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.zone = zone
        self.fence = fence
        self.retain_seconds = retain_seconds
        self.check_seconds = check_seconds
        self._clock = clock
        self._due = 0.0
        self._removing = True  # a crash may have left removals: finish them first

    def turn(self, checked_batch: int, seconds: float = TURN_SECONDS) -> None:
        """One bounded step; `checked_batch`: the serving store's live == lake gate. A landing
        zone failing (OSError) leaves the work for a later turn."""
        now = self._clock()
        try:
            if not self._removing and now >= self._due:
                advance = advance_record(self.zone, checked_batch, self.retain_seconds, self.fence)
                self._due = now if advance.more else now + self.check_seconds
                self._removing = True
            if self._removing:
                self._removing = not remove_expired(self.zone, time.monotonic() + seconds)
        except OSError as error:
            self._due = now + self.check_seconds
            log.warning("expiring landed batches in %s: %s; retrying later", self.zone.root, error)
