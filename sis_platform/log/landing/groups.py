"""Landing a batch in groups: `GroupWriter`, for a resident consumer holding the lease.

Each group is a part of the open batch, `batches/<key>/part-<nnnnn>.parquet` (parts numbered
from 0), written exactly like a one-file batch: rows and links by `linked_rows` (the batch's
`msg_seq` runs on across its parts and the chain runs on from part to part), a temporary file
fsync'd, claimed with a hard link under the fence, the folder fsync'd. Each part's metadata
holds its batch's running anchor (messages so far, the batch's first previous link, the head
after this part) plus the running body bytes, the part's number and when the batch was opened,
so the last part alone says where the batch stands.

Sealing writes the seal record `batches/<key>/_seal.json` (why the batch ended, who sealed it
under which token, its counts: the one-file batch keeps `closed_by` in its metadata, which a
part cannot know when it is written) and then the anchor `anchors/<key>.json`, both under the
fence. The anchor is what makes the batch landed: a crash between the two leaves the batch
open, and the next seal writes the record again before the anchor. After the anchor the record
never changes.

Crash consistency: a part not claimed is a partial file in `tmp/` (`clean_partials`); a part
claimed whose group the queue did not commit is redelivered and landed again in a later part
(duplicates by message id, as with batches); a batch left open is sealed by `recover()` (or by
`ZoneWriter.land` in sensor mode) from its last part.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pyarrow.parquet as pq

from sis_platform.log.chain import Anchor, file_sha256, fsync_dir, verify_messages
from sis_platform.log.landing.rows import (
    BYTES_KEY,
    FENCE_TOKEN_KEY,
    LEASE_HOLDER_KEY,
    OPENED_AT_KEY,
    PART_KEY,
    PART_RE,
    SEAL_RECORD,
    ClosedBy,
    LandedBatch,
    LandedGroup,
    MovedAside,
    OpenBatch,
    anchor_metadata,
    anchor_of,
    batch_key,
    batch_seq_of,
    linked_rows,
    part_name,
    write_partial,
)
from sis_platform.log.seal import LogTampered
from sis_platform.queues.base import ReceivedMessage
from sis_platform.runtime.faults import crash_point

if TYPE_CHECKING:
    from sis_platform.intake.lease import Fence
    from sis_platform.log.landing.writer import ZoneWriter


class GroupWriter:
    """Lands groups into the open batch for a resident consumer holding the lease. Keeps the
    chain head and the next batch, part and message numbers in memory: `land` is O(1) in the
    log's length (it never lists the zone); the zone's tail is read at construction and by
    `recover`.

    Only one writer may land in a zone at a time (the consumer lease's holder, with `fence`);
    a writer whose lease was taken over lands nothing (`FencedOff`) and must be replaced by a
    new one, which recovers the tail. One thread uses a writer at a time.

    A `land` that raised may still have claimed its part (an OSError after the link): the
    writer then reads the tail again before the next group, so the part is not claimed twice;
    the messages of that part stay in the log (their redelivered copies land again later, as
    duplicates by message id), and `landed_after` reads them back."""

    def __init__(self, zone: ZoneWriter, fence: Fence | None = None) -> None:
        self.zone = zone
        self.fence = fence
        self._load()

    def _load(self) -> None:
        tail = self.zone.catalog.tail()
        self._last_seq = tail.seq
        self._head = tail.head
        self._open = tail.open
        # sha256 of each part of the open batch as this writer wrote it, in order: what sealing
        # compares the parts on disk with. None when the open batch was found on disk (its
        # seal then reads and checks every row instead: verify_open_batch).
        self._digests: list[str] | None = [] if tail.open is None else None
        # Set when a land failed after it may have claimed its part (e.g. the folder's fsync
        # failed after the link): the next land reads the tail from disk again.
        self._unsure = False

    @property
    def open_batch(self) -> OpenBatch | None:
        """The batch the next group goes into, when one is open."""
        return self._open

    def recover(self) -> LandedBatch | None:
        """Take over the zone's tail after taking the lease: remove partial files a crash left,
        read the tail again, restore a missing anchor of a one-file last batch, and seal a batch
        left open by a crash or an earlier holder (with the reason its seal record gives, else
        `ClosedBy.RECOVERED`). The batch sealed, or None."""
        self.zone.ensure()
        self.zone.clean_partials()
        self._load()
        if self._open is None:
            if self._last_seq and self.zone.batch_path(batch_key(self._last_seq)).is_file():
                self.zone.ensure_anchor(batch_key(self._last_seq))
            return None
        batch = seal_batch(self.zone, self._open, None, self.fence)
        self._open = None
        return batch

    def land(
        self, messages: Sequence[ReceivedMessage | MovedAside], *, now: datetime | None = None
    ) -> LandedGroup:
        """Land `messages` durably as the next part of the open batch (a new batch, numbered
        after the last, when none is open). Under the fence: `FencedOff` and nothing landed
        when the lease was taken over."""
        if not messages:
            raise ValueError("a landing group needs at least one message")
        landed_at = now or datetime.now(UTC)
        if self._unsure:
            self._load()
        current = self._open
        if current is None:
            seq = self._last_seq + 1
            current = OpenBatch(batch_key(seq), seq, 0, 0, 0, landed_at, self._head.hex(), "")
            self._prepare_folder(current.key)
            self._digests = []
        rows = linked_rows(
            messages,
            key=current.key,
            seq=current.seq,
            first_msg_seq=current.messages,
            prev=self._head,
            received_at=landed_at,
        )
        after = OpenBatch(
            key=current.key,
            seq=current.seq,
            messages=current.messages + len(messages),
            bytes=current.bytes + rows.bytes,
            parts=current.parts + 1,
            opened_at=current.opened_at,
            first_prev=current.first_prev,
            head=rows.head.hex(),
        )
        running = Anchor(after.key, after.messages, after.first_prev, after.head)
        metadata = anchor_metadata(self.zone.signer.sign(running, part=current.parts))
        metadata[PART_KEY] = str(current.parts).encode()
        metadata[BYTES_KEY] = str(after.bytes).encode()
        metadata[OPENED_AT_KEY] = after.opened_at.astimezone(UTC).isoformat().encode()
        if self.fence is not None:
            metadata[FENCE_TOKEN_KEY] = str(self.fence.token).encode()
            metadata[LEASE_HOLDER_KEY] = self.fence.holder.encode()
        table = rows.table.replace_schema_metadata(metadata)
        tmp = write_partial(table, self.zone.tmp_dir, f"{current.key}.{part_name(current.parts)}")
        digest = file_sha256(tmp)  # read back from the page cache: microseconds
        crash_point("landing.before_claim")
        final = self.zone.batch_dir(current.key) / part_name(current.parts)
        try:
            with self._fenced():
                # link() never overwrites: a part of this number claimed by anyone else stays.
                self._unsure = True
                os.link(tmp, final)
                fsync_dir(final.parent)
                self._unsure = False
        finally:
            tmp.unlink(missing_ok=True)
        self._open, self._head, self._last_seq = after, rows.head, after.seq
        if self._digests is not None:
            self._digests.append(digest)
        return LandedGroup(
            batch_key=current.key,
            batch_seq=current.seq,
            part=current.parts,
            first_msg_seq=current.messages,
            messages=len(messages),
            bytes=rows.bytes,
            last_link=after.head,
            path=final,
        )

    def seal(self, closed_by: ClosedBy) -> LandedBatch | None:
        """Seal the open batch (write its seal record and anchor, under the fence): from now on
        it is landed. None when no batch is open."""
        if self._open is None:
            return None
        batch = seal_batch(self.zone, self._open, closed_by, self.fence, self._digests)
        self._open = None
        return batch

    def _prepare_folder(self, key: str) -> None:
        """Create the batch's folder (0700) durably. A crash before its first part leaves an
        empty folder, which is no batch (the next writer or `land` reuses or removes it)."""
        self.zone.ensure()
        folder = self.zone.batch_dir(key)
        folder.mkdir(mode=0o700, exist_ok=True)
        fsync_dir(self.zone.batches_dir)

    def _fenced(self) -> contextlib.AbstractContextManager[None]:
        return self.fence.held() if self.fence is not None else contextlib.nullcontext()


def open_batch_of(key: str, parts: list[Path]) -> OpenBatch:
    """Where a batch in parts stands, from its last part's metadata (`parts` in order, not
    empty)."""
    metadata = pq.read_schema(parts[-1]).metadata or {}
    anchor = anchor_of(key, metadata)
    match = PART_RE.match(parts[-1].name)
    if anchor is None or match is None:
        raise ValueError(f"{parts[-1]} is not a landing part (no running anchor in its metadata)")
    try:
        opened_at = datetime.fromisoformat(metadata[OPENED_AT_KEY].decode())
        body_bytes = int(metadata[BYTES_KEY])
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{parts[-1]} is not a landing part: {exc}") from exc
    return OpenBatch(
        key=key,
        seq=batch_seq_of(key),
        messages=anchor.messages,
        bytes=body_bytes,
        parts=int(match.group(1)) + 1,
        opened_at=opened_at,
        first_prev=anchor.first_prev,
        head=anchor.head,
    )


def seal_batch(
    zone: ZoneWriter,
    batch: OpenBatch,
    closed_by: ClosedBy | None,
    fence: Fence | None,
    part_digests: list[str] | None = None,
) -> LandedBatch:
    """Seal an open batch: check its parts (`verify_open_batch`) and the witness, then write
    its seal record and its signed anchor under `fence`, then move the witness on. `closed_by`
    None: the reason a seal record left by an interrupted seal gives, else
    `ClosedBy.RECOVERED`. A batch found sealed already is returned as its anchor says.
    LogTampered, and nothing written, when its parts were changed or the witness has seen this
    batch number sealed already. `part_digests`: the sha256 of every part as its writer wrote
    it, which makes the check of the parts a hash of each file (see `verify_open_batch`)."""
    folder = zone.batch_dir(batch.key)
    reason = closed_by or _recorded_reason(folder) or ClosedBy.RECOVERED
    anchor = zone.signer.sign(Anchor(batch.key, batch.messages, batch.first_prev, batch.head))
    existing = zone.anchors.read(batch.key)
    if existing is None:
        verify_open_batch(zone, batch, part_digests)
        zone.signer.check_witness(anchor)
        existing = _write_seal(zone, batch, reason, anchor, fence)
    if existing is not None:
        anchor = existing
        reason = _recorded_reason(folder) or reason
    zone.signer.advance_witness(anchor)
    token = fence.token if fence is not None else None
    return LandedBatch(
        batch.key, batch.seq, folder, anchor.messages, batch.bytes, anchor.head, token, reason
    )


def _write_seal(
    zone: ZoneWriter, batch: OpenBatch, reason: ClosedBy, anchor: Anchor, fence: Fence | None
) -> Anchor | None:
    """Write the seal record, then the anchor, under `fence`; the anchor found instead when
    the batch was sealed meanwhile (else None)."""
    folder = zone.batch_dir(batch.key)
    record = {
        "closed_by": reason.value,
        "fence_token": fence.token if fence is not None else None,
        "lease_holder": fence.holder if fence is not None else None,
        "messages": batch.messages,
        "parts": batch.parts,
        "bytes": batch.bytes,
        "sealed_at": datetime.now(UTC).isoformat(),
    }
    zone.ensure()
    tmp = zone.tmp_dir / f"{batch.key}.seal.{uuid.uuid4().hex}.partial"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(record, sort_keys=True).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk: leave no partial record behind
        raise
    try:
        with fence.held() if fence is not None else contextlib.nullcontext():
            existing = zone.anchors.read(batch.key)
            if existing is None:
                os.replace(tmp, folder / SEAL_RECORD)
                fsync_dir(folder)
                zone.anchors.write(anchor)
    finally:
        tmp.unlink(missing_ok=True)
    return existing


def verify_open_batch(
    zone: ZoneWriter, batch: OpenBatch, part_digests: list[str] | None = None
) -> None:
    """Check an open batch's parts before its anchor pins them; LogTampered naming the batch,
    the part or message, and what was found otherwise. Its cost is the batch's, never the log's.

    With `part_digests` (the sealing writer landed every part itself), each part file must
    hold exactly the bytes it wrote: one hash per part. Otherwise (a batch found open after a
    restart) every row is read: the last part's running anchor must be signed with the log key
    and say what `batch` says, and the parts' rows, in order, must hold exactly those messages,
    every field matching its link, the links running from the batch's first previous link to
    that head."""
    # The parts the batch holds, by number: never a listing (its cost would grow with the zone).
    parts = [zone.batch_dir(batch.key) / part_name(i) for i in range(batch.parts)]
    missing = [i for i, path in enumerate(parts) if not path.is_file()]
    if missing:
        _tampered(batch, [f"part(s) {', '.join(map(str, missing))} missing (a part was removed)"])
    if part_digests is not None and len(part_digests) == len(parts):
        changed = [i for i, p in enumerate(parts) if file_sha256(p) != part_digests[i]]
        if changed:
            _tampered(
                batch,
                [
                    f"part {i} differs from what the writer landed (its bytes were changed)"
                    for i in changed
                ],
            )
        return
    _verify_open_rows(zone, batch, parts)


def _tampered(batch: OpenBatch, problems: list[str]) -> NoReturn:
    raise LogTampered(
        f"batch {batch.key}: not sealed: its open parts were edited before sealing: "
        + "; ".join(problems[:5])
    )


def _verify_open_rows(zone: ZoneWriter, batch: OpenBatch, parts: list[Path]) -> None:
    """Every row of the open batch against its links and the last part's signed running
    anchor (see `verify_open_batch`)."""
    expected = Anchor(batch.key, batch.messages, batch.first_prev, batch.head)
    problems: list[str] = []
    claimed = anchor_of(batch.key, pq.read_schema(parts[-1]).metadata or {}) if parts else None
    if claimed is None:
        problems.append("its last part carries no running anchor")
    else:
        last_part = len(parts) - 1
        key = zone.signer.log_key()
        if key is not None and (problem := key.problem(claimed, part=last_part)) is not None:
            problems.append(f"part {last_part}: {problem}")
        if claimed.unsigned() != expected:
            problems.append(
                f"part {last_part} says {claimed.messages} message(s) ending on "
                f"{claimed.head[:16]}..., the writer landed {batch.messages} ending on "
                f"{batch.head[:16]}... (a part was removed, added or rewritten)"
            )
    report = verify_messages(
        batch.key,
        zone.catalog.stored_messages(batch.key, files=parts),
        first_prev=batch.first_prev,
        source="open batch",
        anchor=expected,
    )
    problems += [str(p) for p in report.problems]
    if problems:
        _tampered(batch, problems)


def _recorded_reason(folder: Path) -> ClosedBy | None:
    try:
        record = json.loads((folder / SEAL_RECORD).read_bytes())
        return ClosedBy(record["closed_by"])
    except (FileNotFoundError, KeyError, ValueError, TypeError):
        return None
