"""Merging a sealed batch's parts into one file: `batches/<key>/part-*.parquet` (one part per
group sis-live landed) becomes `batches/<key>.parquet`, the form `ZoneWriter.land` writes, so a
sealed batch is one file whatever its intake. Run by sis-live in idle turns (`Merger`) and by
`sis-live merge` over an existing zone (`merge_zone`).

Merging one batch (`merge_batch`), only once it is sealed (its anchor exists; the open batch is
never merged):
1. the parts' rows, in order, are written to a temporary file in `tmp/` (fsync'd) whose metadata
   is the batch's signed anchor (as a one-file batch's is), with who landed it (its last part's
   fence token and lease holder) and why it ended (its seal record);
2. that file is verified before anything points at it: the anchor signed with the log key, the
   last part's signed running anchor equal to it, and every row of the file following its link
   from the anchor's first link to its head, the anchored number of messages;
3. it is claimed with a hard link at `batches/<key>.parquet` under the fence (a link never
   overwrites), and the folder fsync'd. From here on readers take the file (`batch_files`
   prefers it): the same rows, in the same order, with the same links and `msg_seq`.

The parts folder is removed (`remove_parts`) only later: `grace_seconds` after the merged file
was written. A reader that listed the parts before the claim (a Spark job of `raw_messages` that
resolved the part paths, sis-live's catch-up or `sis-trace` holding a batch's file list, the
chain check reading the parts) opens them within that time; a grace bounds every such reader,
where "only batches the lake has read" would not cover sis-trace, sis-verify-log or a
re-materialization, and would make sis-live depend on Dagster. The parts a grace keeps are
bounded: one grace of batches (at the defaults, an hour: ~30 batches).

Crash consistency: before the claim, a partial file in `tmp/` (removed by `clean_partials`) and
the parts untouched; after the claim, the file and the parts both whole (readers take the file;
the next pass removes the parts); in the middle of removing parts, the file whole and some parts
gone, which no reader looks at once the file exists (the next pass removes the rest). Crash
points `merge.before_claim`, `merge.after_claim`, `merge.mid_removal`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from sis_platform.log.chain import Anchor, fsync_dir, verify_messages
from sis_platform.log.landing.rows import (
    BATCH_KEY_RE,
    CLOSED_BY_KEY,
    FENCE_TOKEN_KEY,
    LANDING_SCHEMA,
    LEASE_HOLDER_KEY,
    PART_RE,
    SEAL_RECORD,
    anchor_metadata,
    anchor_of,
    write_partial,
)
from sis_platform.log.seal import LogTampered
from sis_platform.runtime.faults import crash_point
from sis_platform.runtime.logs import concerning

if TYPE_CHECKING:
    from sis_platform.intake.lease import Fence
    from sis_platform.log.landing.upkeep import Upkeep

log = logging.getLogger(__name__)

# How many parts a merged batch had (the merged file's metadata; the seal record goes with the
# parts folder).
MERGED_PARTS_KEY = b"sis:merged_parts"
MERGED_SOURCE = "merged file"
# The time one idle turn of sis-live spends merging: parts read and parts removed stop at this
# budget (after one at least); writing, verifying and claiming a merged file is a turn's step
# of its own.
TURN_SECONDS = 0.05


@dataclass(frozen=True)
class MergedBatch:
    """A batch merged into one file: its key, how many parts it had, its messages, the file."""

    key: str
    parts: int
    messages: int
    path: Path


class MergeReport(NamedTuple):
    """What `merge_zone` did: batches merged, parts folders removed, parts folders kept for
    their grace, batches refused (their parts do not verify: left as they are)."""

    merged: int
    removed: int
    kept: int
    refused: list[str]


def mergeable(zone: Upkeep, key: str) -> bool:
    """Whether batch `key` is sealed (anchored), in parts, and not merged yet."""
    return (
        not zone.batch_path(key).is_file()
        and zone.anchors.path(key).exists()
        and bool(zone.parts(key))
    )


def merge_batch(zone: Upkeep, key: str, fence: Fence | None = None) -> MergedBatch | None:
    """Merge sealed batch `key`'s parts into `batches/<key>.parquet` (module docstring); None
    when there is nothing to merge (open, not in parts, or merged already). LogTampered, and
    nothing claimed, when the parts do not verify against the anchor; FencedOff when the lease
    was taken over."""
    if not mergeable(zone, key):
        return None
    parts = zone.parts(key)
    return claim_merged(zone, key, parts, [read_part(p) for p in parts], fence)


def read_part(path: Path) -> pa.Table:
    """A part's rows, without its metadata (its running anchor); LogTampered when the file is
    not Parquet in the landing schema."""
    try:
        table = pq.ParquetFile(path).read(use_threads=False).replace_schema_metadata(None)
    except pa.ArrowException as exc:
        raise LogTampered(f"{path}: not a landing part: {exc}") from exc
    if not table.schema.equals(LANDING_SCHEMA):
        raise LogTampered(f"{path}: not a landing part: its columns differ from the landing's")
    return table


def claim_merged(
    zone: Upkeep, key: str, parts: list[Path], tables: list[pa.Table], fence: Fence | None
) -> MergedBatch | None:
    """Steps 1 to 3 of the module docstring for sealed batch `key`, whose `parts` (in order)
    hold `tables`; None when it was merged meanwhile."""
    anchor = zone.anchors.read(key)
    if anchor is None or not parts or zone.batch_path(key).is_file():
        return None
    zone.ensure()
    table = pa.concat_tables(tables).combine_chunks()  # one chunk: written as one
    last = pq.read_schema(parts[-1]).metadata or {}
    metadata = _merged_metadata(zone, key, anchor, last, len(parts))
    tmp = write_partial(table.replace_schema_metadata(metadata), zone.tmp_dir, f"{key}.merged")
    try:
        problems = _problems(zone, key, anchor, last, len(parts) - 1, tmp)
        if problems:
            raise LogTampered(f"batch {key}: not merged: " + "; ".join(problems[:5]))
        crash_point("merge.before_claim")
        final = zone.batch_path(key)
        with fence.held() if fence is not None else contextlib.nullcontext():
            try:
                os.link(tmp, final)
            except FileExistsError:
                return None  # merged meanwhile by another merger: that file is the batch
            fsync_dir(zone.batches_dir)
    finally:
        tmp.unlink(missing_ok=True)
    crash_point("merge.after_claim")
    return MergedBatch(key, len(parts), anchor.messages, final)


def _merged_metadata(
    zone: Upkeep, key: str, anchor: Anchor, last: dict[bytes, bytes], parts: int
) -> dict[bytes, bytes]:
    """A one-file batch's metadata: the signed anchor, who landed it, why it ended."""
    metadata = anchor_metadata(anchor)
    for name in (FENCE_TOKEN_KEY, LEASE_HOLDER_KEY):
        if name in last:
            metadata[name] = last[name]
    closed_by = zone.catalog.closed_by(key)
    if closed_by is not None:
        metadata[CLOSED_BY_KEY] = closed_by.value.encode()
    metadata[MERGED_PARTS_KEY] = str(parts).encode()
    return metadata


def _problems(
    zone: Upkeep,
    key: str,
    anchor: Anchor,
    last: dict[bytes, bytes],
    last_part: int,
    merged: Path,
) -> list[str]:
    """What is wrong with the merged file `merged` against the batch's anchor and its last
    part's running anchor (empty: it may be claimed)."""
    problems: list[str] = []
    running = anchor_of(key, last)
    log_key = zone.catalog.signer.log_key()
    if log_key is not None:
        if (text := log_key.problem(anchor)) is not None:
            problems.append(f"its anchor: {text}")
        if running is not None and (text := log_key.problem(running, part=last_part)) is not None:
            problems.append(f"part {last_part}: {text}")
    if running is None or running.unsigned() != anchor.unsigned():
        problems.append(f"part {last_part}'s running anchor differs from the batch's anchor")
    report = verify_messages(
        key,
        zone.catalog.stored_messages(key, check_overflow=False, files=[merged]),
        first_prev=anchor.first_prev,
        source=MERGED_SOURCE,
        anchor=anchor,
    )
    return problems + [str(p) for p in report.problems]


def remove_parts(zone: Upkeep, key: str, deadline: float | None = None) -> bool:
    """Remove merged batch `key`'s parts folder (its parts, then its seal record, then the
    folder, fsync'd), never the parts of a batch whose merged file is missing. Stops once
    `time.monotonic()` passes `deadline` (after one file at least): True when the folder is
    gone."""
    if not zone.batch_path(key).is_file():
        return False
    folder = zone.batch_dir(key)
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return True
    ordered = [n for n in names if PART_RE.match(n)] + [n for n in names if n == SEAL_RECORD]
    for i, name in enumerate(ordered):
        if i == 1:
            crash_point("merge.mid_removal")
        if i > 0 and deadline is not None and time.monotonic() > deadline:
            return False  # at least one file per call
        (folder / name).unlink(missing_ok=True)
    folder.rmdir()
    fsync_dir(zone.batches_dir)
    return True


def merged_at(zone: Upkeep, key: str) -> float:
    """When batch `key`'s merged file was written (epoch seconds, its mtime; a hard link keeps
    it): the start of its parts' grace."""
    return zone.batch_path(key).stat().st_mtime


def folder_keys(zone: Upkeep) -> list[str]:
    """The keys of every batch folder (open, sealed, or merged with parts left), in order: one
    listing of `batches/`."""
    if not zone.batches_dir.is_dir():
        return []
    with os.scandir(zone.batches_dir) as entries:
        return sorted(e.name for e in entries if BATCH_KEY_RE.match(e.name) and e.is_dir())


def merge_zone(
    zone: Upkeep,
    fence: Fence | None,
    grace_seconds: float,
    *,
    still_held: Callable[[], bool] = lambda: True,
) -> MergeReport:
    """Merge every sealed batch in parts in `zone` and remove the parts of merged batches whose
    grace has passed (the operator's command for an existing zone: `sis-live merge`). A batch
    whose parts do not verify is left as it is and named in the report. Stops early when
    `still_held()` turns False (the lease was lost)."""
    merged = removed = kept = 0
    refused: list[str] = []
    for key in folder_keys(zone):
        if not still_held():
            break
        try:
            if merge_batch(zone, key, fence) is not None:
                merged += 1
        except LogTampered as error:
            log.error("%s", error, extra=concerning(batch=key))
            refused.append(key)
            continue
        if not zone.batch_path(key).is_file():
            continue  # open (never merged) or refused
        if time.time() - merged_at(zone, key) >= grace_seconds and remove_parts(zone, key):
            removed += 1
        else:
            kept += 1
    return MergeReport(merged, removed, kept, refused)


class _Removal(NamedTuple):
    """A merged batch whose parts folder is removed once `due` (epoch seconds) has passed."""

    key: str
    due: float


@dataclass
class _Reading:
    """The batch a `Merger` is merging: its parts, and the rows of those read so far."""

    key: str
    parts: list[Path]
    tables: list[pa.Table]

    @property
    def done(self) -> bool:
        return len(self.tables) == len(self.parts)


class Merger:
    """sis-live's merging, a bounded step per idle turn (`turn`). Knows the batches to merge
    and the parts folders to remove from one listing of the zone when built (after the lease
    holder's `recover`) and from each seal after (`sealed`); never lists the zone again.

    A batch's parts are read over as many turns as the budget needs (the rows read so far are
    held: one batch, bounded by the batch bounds); writing, verifying and claiming its merged
    file is one turn's step of its own. A parts folder is removed over as many turns as
    needed."""

    def __init__(
        self,
        zone: Upkeep,
        fence: Fence | None,
        grace_seconds: float,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.zone = zone
        self.fence = fence
        self.grace_seconds = grace_seconds
        self._now = wall_clock
        self._to_merge: deque[str] = deque()
        self._to_remove: deque[_Removal] = deque()
        self._reading: _Reading | None = None
        for key in folder_keys(zone):
            if zone.batch_path(key).is_file():
                self._to_remove.append(_Removal(key, merged_at(zone, key) + grace_seconds))
            elif zone.anchors.path(key).exists():
                self._to_merge.append(key)

    @property
    def pending(self) -> int:
        """Batches to merge, and parts folders to remove, that this merger knows of."""
        return len(self._to_merge) + len(self._to_remove)

    def sealed(self, key: str) -> None:
        """Batch `key` was sealed: merge it in a later turn."""
        self._to_merge.append(key)

    def turn(self, seconds: float = TURN_SECONDS) -> None:
        """A bounded step: remove the parts folders whose grace has passed; when that is done,
        read the next sealed batch's parts (at least one, more while time is left) or claim its
        merged file. FencedOff when the lease was taken over; a landing zone failing (OSError)
        leaves the work for a later turn."""
        deadline = time.monotonic() + seconds
        try:
            if self._remove_due(deadline) and self._to_merge:
                self._merge_step(deadline)
        except OSError as error:
            self._reading = None  # read again from the first part next turn
            log.warning("merging landed batches in %s: %s; retrying later", self.zone.root, error)

    def _remove_due(self, deadline: float) -> bool:
        """Remove the parts folders due until `deadline`; whether none due is left."""
        while self._to_remove and self._to_remove[0].due <= self._now():
            if not remove_parts(self.zone, self._to_remove[0].key, deadline):
                return False  # out of time: the rest of this folder next turn
            self._to_remove.popleft()
        return True

    def _merge_step(self, deadline: float) -> None:
        """Read the next batch's parts until `deadline`; once all are read (in an earlier
        turn, or this one), claim its merged file in a turn of its own."""
        reading = self._reading
        if reading is not None and reading.done:
            self._reading = None
            self._claim(reading)
            return
        if reading is None:
            key = self._to_merge[0]
            if not mergeable(self.zone, key):
                self._to_merge.popleft()
                self._merged(key, None)
                return
            reading = self._reading = _Reading(key, self.zone.parts(key), [])
        while not reading.done:  # at least one part per turn
            try:
                reading.tables.append(read_part(reading.parts[len(reading.tables)]))
            except LogTampered as error:
                self._refuse(error)
                return
            if time.monotonic() >= deadline:
                return

    def _claim(self, reading: _Reading) -> None:
        key = reading.key
        try:
            merged = claim_merged(self.zone, key, reading.parts, reading.tables, self.fence)
        except LogTampered as error:
            self._refuse(error)
            return
        self._to_merge.popleft()
        self._merged(key, merged)

    def _refuse(self, error: LogTampered) -> None:
        """The next batch's parts do not verify: they stay as they are for the chain check
        to report, and the batch is never tried again by this merger."""
        log.error("%s", error, extra=concerning(batch=self._to_merge[0]))
        self._reading = None
        self._to_merge.popleft()

    def _merged(self, key: str, merged: MergedBatch | None) -> None:
        """Batch `key` is done with: its parts folder's removal is due after the grace."""
        if self.zone.batch_path(key).is_file():
            self._to_remove.append(_Removal(key, merged_at(self.zone, key) + self.grace_seconds))
        if merged is not None:
            log.debug(
                "merged batch %s: %d part(s) into one file",
                key,
                merged.parts,
                extra=concerning(batch=key),
            )
