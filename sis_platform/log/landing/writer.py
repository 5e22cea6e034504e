"""`ZoneWriter`: what lands in a landing zone: a batch landed whole as one file (the sensor's
intake), bodies too large for a batch moved aside to `overflow/`, a missing anchor restored
after a crash, what a crash left half-written removed, and whether the zone has room for what
is about to be got. A resident consumer lands groups through it (`GroupWriter` and sealing, in
`groups.py` beside it).

Every file is written to a temporary name in `tmp/`, fsync'd, claimed with a hard link (which
never overwrites) and its folder fsync'd; a batch's anchor is signed (`AnchorSigner`) and
written right after its claim, under the consumer lease's fence when one is given. Crash point
`landing.before_claim`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sis_platform.log.chain import Anchor, fsync_dir, write_durably
from sis_platform.log.landing.catalog import Catalog
from sis_platform.log.landing.groups import seal_batch
from sis_platform.log.landing.layout import ZoneLayout
from sis_platform.log.landing.rows import (
    CLOSED_BY_KEY,
    FENCE_TOKEN_KEY,
    LEASE_HOLDER_KEY,
    ClosedBy,
    LandedBatch,
    MovedAside,
    OverflowBody,
    anchor_metadata,
    batch_key,
    linked_rows,
    write_partial,
)
from sis_platform.queues.base import ReceivedMessage
from sis_platform.runtime.faults import crash_point

if TYPE_CHECKING:
    from sis_platform.intake.lease import Fence


class LandingFull(OSError):
    """Not enough free space in the landing zone for what is about to be got (ENOSPC)."""


class ZoneWriter(ZoneLayout):
    """Writes into the zone `catalog` reads (the same root and anchor signer): the tail it
    lands after is the catalog's."""

    def __init__(self, catalog: Catalog) -> None:
        super().__init__(catalog.root)
        self.catalog = catalog
        self.signer = catalog.signer

    def probe(self) -> None:
        """Prove the zone can take a batch now: create, write, fsync and remove a small file in
        its temporary folder. Raises OSError (a full disk, a read-only or unreachable mount)."""
        self.ensure()
        probe = self.tmp_dir / f"probe.{uuid.uuid4().hex}.partial"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"probe")
            os.fsync(fd)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)

    def free_bytes(self) -> int:
        """Bytes free for this process on the zone's file system (OSError: no zone there; a
        probe makes its folders)."""
        return shutil.disk_usage(self.root).free

    def ensure_room(self, needed: int) -> None:
        """Raise `LandingFull` unless `needed` bytes are free now (a group's bound, checked
        before it is got: `landing_bytes_bound`)."""
        free = self.free_bytes()
        if free < needed:
            raise LandingFull(
                errno.ENOSPC,
                f"{free} bytes free in {self.root}; what is about to be got may need {needed}",
            )

    # -- landing a batch as one file --------------------------------------------------------

    def move_aside(self, body: bytes) -> OverflowBody:
        """Write a body too large for a batch to `overflow/<sha256>.body`, durably (temporary
        name, fsync, rename, folder fsync), readable by its owner only. Content-addressed: a
        redelivered copy lands on the same file."""
        self.overflow_dir.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(body).hexdigest()
        final = self.overflow_dir / f"{digest}.body"
        # Same name, same bytes: replacing a redelivered copy changes nothing.
        write_durably(final, body, replace=True)
        return OverflowBody(len(body), digest, str(final.relative_to(self.root)))

    def land(
        self,
        messages: Sequence[ReceivedMessage | MovedAside],
        *,
        now: datetime | None = None,
        fence: Fence | None = None,
        closed_by: ClosedBy | None = None,
    ) -> LandedBatch:
        """Write `messages` as the next batch, in one file, durably, with its anchor. Returns
        once both are on disk. A batch left open in parts by a resident consumer is sealed
        first (`ClosedBy.RECOVERED`), so the log goes on after it.

        With `fence`, the batch is claimed (and anchored) only while the fence's token is the
        lease's current token (checked under the lease lock right before the claim); otherwise
        `FencedOff` is raised and nothing is landed. `closed_by` (why the batch ended) is kept
        with it."""
        if not messages:
            raise ValueError("a landing batch needs at least one message")
        self.ensure()
        landed_at = now or datetime.now(UTC)
        if (open_batch := self.catalog.tail().open) is not None:
            seal_batch(self, open_batch, None, fence)
        prev_seq, first_prev = self.catalog.last()
        seq = prev_seq + 1
        key = batch_key(seq)
        rows = linked_rows(
            messages, key=key, seq=seq, first_msg_seq=0, prev=first_prev, received_at=landed_at
        )
        anchor = self.signer.sign(Anchor(key, len(messages), first_prev.hex(), rows.head.hex()))
        self.signer.check_witness(anchor)
        metadata = anchor_metadata(anchor)
        if fence is not None:
            metadata[FENCE_TOKEN_KEY] = str(fence.token).encode()
            metadata[LEASE_HOLDER_KEY] = fence.holder.encode()
        if closed_by is not None:
            metadata[CLOSED_BY_KEY] = ClosedBy(closed_by).value.encode()
        tmp = write_partial(rows.table.replace_schema_metadata(metadata), self.tmp_dir, key)
        crash_point("landing.before_claim")
        final = self.batch_path(key)
        try:
            if fence is None:
                self._claim(tmp, final, anchor)
            else:
                with fence.held():
                    self._claim(tmp, final, anchor)
        finally:
            tmp.unlink(missing_ok=True)
        token = fence.token if fence is not None else None
        return LandedBatch(
            key, seq, final, len(messages), rows.bytes, rows.head.hex(), token, closed_by
        )

    def _claim(self, tmp: Path, final: Path, anchor: Anchor) -> None:
        # link() never overwrites: if two consumers raced for this number (the consumer lease
        # exists to prevent it), the second fails here instead of replacing a batch.
        os.link(tmp, final)
        fsync_dir(self.batches_dir)
        self.anchors.write(anchor)
        self.signer.advance_witness(anchor)
        # A folder a crash left before the first part of this number: no batch, now superseded.
        try:
            self.batch_dir(anchor.batch_key).rmdir()
        except OSError:
            pass

    def ensure_anchor(self, key: str) -> Anchor | None:
        """The batch's anchor, written from its file's metadata when a crash between the claim
        and the anchor left a one-file batch without one (intake calls this before handing a
        batch on). None when the file carries no chain metadata either, and for a batch in
        parts not sealed yet (only its lease holder seals it: GroupWriter)."""
        anchor = self.anchors.read(key)
        if anchor is not None or not self.batch_path(key).is_file():
            return anchor
        anchor = self.catalog.anchor_from_file(key)
        if anchor is not None:
            try:
                self.anchors.write(anchor)
            except FileExistsError:  # written meanwhile: the one on disk is the anchor
                return self.anchors.read(key)
            self.signer.advance_witness(anchor)
        return anchor

    def clean_partials(self) -> int:
        """Remove temporary files left by a crash mid-write (batch files, parts, seal records,
        bodies being moved aside); they never became part of the log. Only the lease holder
        may: a standby would remove the holder's files in flight."""
        removed = 0
        for folder, pattern in ((self.tmp_dir, "*.partial"), (self.overflow_dir, ".*.partial")):
            if folder.is_dir():
                for p in folder.glob(pattern):
                    p.unlink(missing_ok=True)
                    removed += 1
        return removed
