"""`LandingZone`: the landing zone's folders, how a batch is landed as one file, and how any
landed batch, of either form, is found and read back.

A batch is either one file `batches/<key>.parquet` (`land`, the sensor's intake) or a folder
`batches/<key>/` of parts `part-<nnnnn>.parquet` landed by a resident consumer
(sis_platform/log/landing/groups.py). A batch in parts is sealed, and only then counts as landed
(`keys`), when its anchor `anchors/<key>.json` exists; a one-file batch is landed once its file
is claimed (its anchor follows right after, or is restored by `ensure_anchor`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sis_platform.domain.limits import Limits
from sis_platform.log.chain import (
    GENESIS_LINK,
    Anchor,
    AnchorStore,
    StoredMessage,
    file_sha256,
    fsync_dir,
)
from sis_platform.log.landing.expiry import BatchExpired, Expiry, read_expiry, reading_from
from sis_platform.log.landing.groups import open_batch_of, seal_batch
from sis_platform.log.landing.reading import LandedMessage, landed_after
from sis_platform.log.landing.rows import (
    BATCH_KEY_RE,
    CLOSED_BY_KEY,
    FENCE_TOKEN_KEY,
    LANDING_SCHEMA,
    LEASE_HOLDER_KEY,
    PART_RE,
    READ_ROWS,
    SEAL_RECORD,
    START_POSITION,
    ClosedBy,
    LandedBatch,
    LogPosition,
    MovedAside,
    OpenBatch,
    OverflowBody,
    anchor_metadata,
    anchor_of,
    batch_key,
    batch_seq_of,
    chain_records,
    linked_rows,
    write_partial,
)
from sis_platform.log.seal import LogKey, LogSeal
from sis_platform.queues.base import ReceivedMessage
from sis_platform.runtime.faults import crash_point

if TYPE_CHECKING:
    from sis_platform.intake.lease import Fence


class Tail(NamedTuple):
    """The end of the log: the last batch's number (0: none), the link after its last message,
    how many messages it holds, and the batch itself when it is open (landed in parts, not
    sealed)."""

    seq: int
    head: bytes
    messages: int
    open: OpenBatch | None


class LandingFull(OSError):
    """Not enough free space in the landing zone for what is about to be got (ENOSPC)."""


class BatchFigures(NamedTuple):
    """What a landed batch holds, counted (raw_messages reports them)."""

    messages: int
    body_bytes: int  # bodies held in the batch (a body moved aside holds none)
    moved_aside: int  # bodies intake moved aside
    redelivered: int  # messages delivered more than once
    first_put: datetime | None  # the earliest put time (None: no message has one)
    last_put: datetime | None


class LandingZone:
    """Batches under `root/batches/`, one Parquet file or one folder of parts each, named by
    batch key; their anchors under `root/anchors/`; bodies moved aside under `root/overflow/`.

    With `seal` (the platform's zones: sis_platform/log/seal.py) every anchor and every part's
    running anchor is signed with the log key, and every seal moves the witness forward; without
    it (a zone opened to read bodies, some tests) anchors are written unsigned, and a verifier
    reports them as such."""

    def __init__(self, root: Path, seal: LogSeal | None = None) -> None:
        self.root = Path(root)
        self.batches_dir = self.root / "batches"
        self.tmp_dir = self.root / "tmp"
        self.overflow_dir = self.root / "overflow"
        self.anchors = AnchorStore(self.root / "anchors")
        self.seal = seal
        self._key: LogKey | None = None

    # -- signing and witnessing anchors -----------------------------------------------------

    def sign(self, anchor: Anchor, part: int | None = None) -> Anchor:
        """`anchor` signed with the log key (as part `part`'s running anchor when given); as it
        is without a seal. The default key file is created for a new log's first batch only;
        a key missing for a log that has one raises LogKeyError."""
        if self.seal is None:
            return anchor
        if self._key is None:
            self._key = self.seal.key(new_log=anchor.first_prev == GENESIS_LINK.hex())
        return self._key.sign(anchor) if part is None else self._key.sign_part(anchor, part)

    def log_key(self) -> LogKey | None:
        """The key the zone's anchors are signed with (None without a seal); LogKeyError when
        it cannot be loaded. Never creates one: a verifier must not invent a key."""
        if self.seal is not None and self._key is None:
            self._key = self.seal.key()
        return self._key

    def check_witness(self, anchor: Anchor) -> None:
        """LogTampered when the witness has seen this batch number (or a later one) sealed
        otherwise: sealing it would write over the evidence of a rollback."""
        if self.seal is not None:
            self.seal.witness.check_can_seal(anchor)

    def advance_witness(self, anchor: Anchor) -> None:
        """Make `anchor`, just written, the witness's latest sealed batch (unless it has a
        later one)."""
        if self.seal is not None:
            self.seal.witness.advance(anchor)

    def ensure(self) -> None:
        self.batches_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

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

    # -- where a batch is -------------------------------------------------------------------

    def batch_path(self, key: str) -> Path:
        """The file of a batch landed as one file (it may not exist: see `batch_files`)."""
        return self.batches_dir / f"{key}.parquet"

    def batch_dir(self, key: str) -> Path:
        """The folder of a batch landed in parts (it may not exist)."""
        return self.batches_dir / key

    def batch_files(self, key: str) -> list[Path]:
        """The batch's landing file, or its parts in order; [] when it has neither."""
        if self.batch_path(key).is_file():
            return [self.batch_path(key)]
        return self.parts(key)

    def landed_files(self, key: str) -> list[Path]:
        """`batch_files`, for a batch that must have been landed: FileNotFoundError if not,
        BatchExpired (one) when it was expired (sis_platform/log/landing/expiry.py)."""
        expiry = self.expiry()
        if expiry is not None and expiry.covers(key):
            raise BatchExpired(
                f"batch {key} was expired from the landing zone {self.root} (batches up to "
                f"{expiry.anchor.batch_key}, SIS_LANDING_RETAIN_DAYS); its messages are in the "
                "lake's raw_messages table"
            )
        files = self.batch_files(key)
        if not files:
            raise FileNotFoundError(f"batch {key} has no landing file in {self.batches_dir}")
        return files

    def batch_location(self, key: str) -> Path:
        """The batch's file, or its folder when it was landed in parts."""
        return self.batch_dir(key) if self._is_segmented(key) else self.batch_path(key)

    def parts(self, key: str) -> list[Path]:
        """The parts of a batch landed in parts, in order ([] for any other batch)."""
        try:
            names = os.listdir(self.batch_dir(key))
        except (FileNotFoundError, NotADirectoryError):
            return []
        numbered = [(int(m.group(1)), n) for n in names if (m := PART_RE.match(n))]
        return [self.batch_dir(key) / n for _, n in sorted(numbered)]

    def _is_segmented(self, key: str) -> bool:
        return not self.batch_path(key).is_file() and self.batch_dir(key).is_dir()

    # -- which batches there are ------------------------------------------------------------

    def keys(self) -> list[str]:
        """Every landed batch key, in landing order: each one-file batch, and each batch in
        parts once it is sealed (a batch still open is not landed yet)."""
        if not self.batches_dir.is_dir():
            return []
        files, folders = self._listing()
        anchored = set(self.anchors.keys())
        expiry = self.expiry()
        return sorted(
            k for k in files | (folders & anchored) if expiry is None or not expiry.covers(k)
        )

    def keys_after(self, seq: int) -> list[str]:
        return [k for k in self.keys() if batch_seq_of(k) > seq]

    def sealed_after(self, seq: int, limit: int) -> list[str]:
        """Up to `limit` landed batch keys after batch `seq`, in order, up to the first batch
        not landed: found by probing each next key's anchor (or one-file batch), so the cost is
        the number of keys returned, not the size of the zone."""
        keys: list[str] = []
        expiry = self.expiry()
        if expiry is not None:
            seq = max(seq, expiry.through_seq)
        while len(keys) < limit:
            key = batch_key(seq + len(keys) + 1)
            if not (self.anchors.path(key).exists() or self.batch_path(key).is_file()):
                break
            keys.append(key)
        return keys

    def _listing(self) -> tuple[set[str], set[str]]:
        """The keys of one-file batches and of batch folders under `batches/`."""
        files: set[str] = set()
        folders: set[str] = set()
        with os.scandir(self.batches_dir) as entries:
            for entry in entries:
                stem = entry.name.removesuffix(".parquet")
                if not BATCH_KEY_RE.match(stem):
                    continue
                if entry.name.endswith(".parquet") and entry.is_file():
                    files.add(stem)
                elif entry.name == stem and entry.is_dir():
                    folders.add(stem)
        return files, folders

    def tail(self) -> Tail:
        """The end of the log, open batch included, read with one listing of the zone.

        The last batch is the latest of the landing files, the batch folders holding a part
        and the anchors: a batch whose file was removed keeps its number and its head, so the
        next batch follows it and the loss shows as a missing batch instead of being papered
        over."""
        files, folders = self._listing() if self.batches_dir.is_dir() else (set(), set())
        anchored = {k for k in self.anchors.keys() if BATCH_KEY_RE.match(k)}
        for key in sorted(files | folders | anchored, reverse=True):
            seq = batch_seq_of(key)
            anchor = self.anchors.read(key)
            if anchor is not None:
                return Tail(seq, bytes.fromhex(anchor.head), anchor.messages, None)
            if key in files:
                return self._file_tail(key)
            parts = self.parts(key)
            if parts:
                batch = open_batch_of(key, parts)
                return Tail(seq, bytes.fromhex(batch.head), batch.messages, batch)
            # A folder a crash left before its first part was claimed: no batch.
        expiry = self.expiry()
        if expiry is not None:  # everything landed was expired: the record holds the head
            anchor = expiry.anchor
            return Tail(expiry.through_seq, bytes.fromhex(anchor.head), anchor.messages, None)
        return Tail(0, GENESIS_LINK, 0, None)

    def _file_tail(self, key: str) -> Tail:
        claimed = self.anchor_from_file(key)
        if claimed is not None:
            return Tail(batch_seq_of(key), bytes.fromhex(claimed.head), claimed.messages, None)
        table = pq.read_table(self.batch_path(key), columns=["chain_link"])
        head = bytes.fromhex(table.column("chain_link")[-1].as_py())
        return Tail(batch_seq_of(key), head, table.num_rows, None)

    def last(self) -> tuple[int, bytes]:
        """The last batch's number and final chain link (0 and the genesis link when empty);
        an open batch is the last batch, its link the one after its last part (see `tail`)."""
        tail = self.tail()
        return tail.seq, tail.head

    def last_position(self) -> LogPosition:
        """The last landed message's position, open batch included (START_POSITION: none)."""
        tail = self.tail()
        return LogPosition(tail.seq, tail.messages - 1) if tail.seq else START_POSITION

    def landed_after(self, position: LogPosition, limits: Limits) -> Iterator[LandedMessage]:
        """Every landed message after `position`, open batch included, in log order, reading
        only the files from that position on, up to the first batch missing (see
        sis_platform/log/landing/reading.py). A moved-aside body is restored when `limits` allow
        it (`restored_body`)."""
        return landed_after(self, reading_from(self, position), limits)

    def expiry(self) -> Expiry | None:
        """The expiry record: which batches were expired from the zone (None: none)."""
        return read_expiry(self.root)

    def anchor(self, key: str) -> Anchor | None:
        """Batch `key`'s anchor: its anchor file, or the expiry record's for the last expired
        batch (the anchor the first kept batch links to). ValueError for a file that is not
        an anchor."""
        anchor = self.anchors.read(key)
        if anchor is None:
            expiry = self.expiry()
            if expiry is not None and expiry.anchor.batch_key == key:
                return expiry.anchor
        return anchor

    # -- landing a batch as one file --------------------------------------------------------

    def move_aside(self, body: bytes) -> OverflowBody:
        """Write a body too large for a batch to `overflow/<sha256>.body`, durably (temporary
        name, fsync, rename, folder fsync), readable by its owner only. Content-addressed: a
        redelivered copy lands on the same file."""
        self.overflow_dir.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(body).hexdigest()
        final = self.overflow_dir / f"{digest}.body"
        tmp = self.overflow_dir / f".{digest}.{uuid.uuid4().hex}.partial"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)  # same name, same bytes: replacing a copy changes nothing
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(self.overflow_dir)
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
        if (open_batch := self.tail().open) is not None:
            seal_batch(self, open_batch, None, fence)
        prev_seq, first_prev = self.last()
        seq = prev_seq + 1
        key = batch_key(seq)
        rows = linked_rows(
            messages, key=key, seq=seq, first_msg_seq=0, prev=first_prev, received_at=landed_at
        )
        anchor = self.sign(Anchor(key, len(messages), first_prev.hex(), rows.head.hex()))
        self.check_witness(anchor)
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
        self.advance_witness(anchor)
        # A folder a crash left before the first part of this number: no batch, now superseded.
        try:
            self.batch_dir(anchor.batch_key).rmdir()
        except OSError:
            pass

    # -- what a batch's files claim ---------------------------------------------------------

    def _metadata(self, key: str) -> dict[bytes, bytes]:
        """The Parquet key-value metadata of the batch's file, or of its last part."""
        files = self.landed_files(key)
        return pq.read_schema(files[-1]).metadata or {}

    def anchor_from_file(self, key: str) -> Anchor | None:
        """The anchor the landing file's own metadata claims, or for a batch in parts its last
        part's (None: written before chain format 2, or not a landing file)."""
        return anchor_of(key, self._metadata(key))

    def unanchored_head(self, key: str) -> str | None:
        """The last link of a batch landed before chain format 2 (its file has no chain
        metadata and it has no anchor); None for any other batch, or no file."""
        if not self.batch_path(key).is_file() or self.anchor_from_file(key) is not None:
            return None
        if self.anchors.path(key).exists():
            return None
        table = pq.read_table(self.batch_path(key), columns=["chain_link"])
        return str(table.column("chain_link")[-1].as_py()) if table.num_rows else None

    def ensure_anchor(self, key: str) -> Anchor | None:
        """The batch's anchor, written from its file's metadata when a crash between the claim
        and the anchor left a one-file batch without one (intake calls this before handing a
        batch on). None when the file carries no chain metadata either, and for a batch in
        parts not sealed yet (only its lease holder seals it: GroupWriter)."""
        anchor = self.anchors.read(key)
        if anchor is not None or not self.batch_path(key).is_file():
            return anchor
        anchor = self.anchor_from_file(key)
        if anchor is not None:
            try:
                self.anchors.write(anchor)
            except FileExistsError:  # written meanwhile: the one on disk is the anchor
                return self.anchors.read(key)
            self.advance_witness(anchor)
        return anchor

    def fence_token(self, key: str) -> int | None:
        """The fencing token the batch (its last part) was landed under (None: no lease)."""
        raw = self._metadata(key).get(FENCE_TOKEN_KEY)
        return int(raw) if raw is not None else None

    def lease_holder(self, key: str) -> str | None:
        """Who landed the batch (its last part), when it was landed under a consumer lease."""
        raw = self._metadata(key).get(LEASE_HOLDER_KEY)
        return raw.decode() if raw is not None else None

    def closed_by(self, key: str) -> ClosedBy | None:
        """Why the batch ended (None: not recorded, or a batch in parts not sealed)."""
        if self._is_segmented(key):
            try:
                record = json.loads((self.batch_dir(key) / SEAL_RECORD).read_bytes())
            except FileNotFoundError:
                return None
            raw_text = record.get("closed_by")
            return ClosedBy(raw_text) if raw_text is not None else None
        raw = self._metadata(key).get(CLOSED_BY_KEY)
        return ClosedBy(raw.decode()) if raw is not None else None

    # -- reading a batch back ---------------------------------------------------------------

    def read(self, key: str) -> pa.Table:
        """The batch's rows, from its file or its parts in order."""
        files = self.landed_files(key)
        tables = [pq.read_table(p, schema=LANDING_SCHEMA) for p in files]
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def figures(self, key: str) -> BatchFigures:
        """The batch's figures, from a few of its columns read a row group at a time."""
        files = self.landed_files(key)
        messages = body_bytes = moved_aside = redelivered = 0
        puts: list[datetime] = []
        for path in files:
            parquet = pq.ParquetFile(path)
            # A file landed before bodies could be moved aside has no body_location.
            columns = [
                c
                for c in ("body", "body_location", "delivery_count", "put_time")
                if c in parquet.schema_arrow.names
            ]
            for rows in parquet.iter_batches(batch_size=READ_ROWS, columns=columns):
                messages += rows.num_rows
                body_bytes += pc.sum(pc.binary_length(rows.column("body"))).as_py() or 0
                if "body_location" in columns:
                    moved_aside += pc.count(rows.column("body_location")).as_py()
                redelivered += pc.sum(pc.greater(rows.column("delivery_count"), 1)).as_py() or 0
                bounds = pc.min_max(rows.column("put_time")).as_py()
                puts += [t for t in (bounds["min"], bounds["max"]) if t is not None]
        return BatchFigures(
            messages,
            body_bytes,
            moved_aside,
            redelivered,
            min(puts, default=None),
            max(puts, default=None),
        )

    def iter_messages(self) -> Iterator[dict[str, object]]:
        """Every landed message in landing order (for tests, trace and the reference check)."""
        for key in self.keys():
            yield from self.read(key).to_pylist()

    def stored_messages(
        self, key: str, *, check_overflow: bool = True, files: Sequence[Path] | None = None
    ) -> Iterator[StoredMessage]:
        """The batch's messages as its landing file (or its parts, in order; or `files`, when
        the caller knows them) holds them, read a few rows at a time, each body hashed again
        (and a moved-aside body's file when `check_overflow`)."""
        for path in files if files is not None else self.landed_files(key):
            for record_batch in pq.ParquetFile(path).iter_batches(batch_size=READ_ROWS):
                yield from self._stored(record_batch, check_overflow)

    def _stored(
        self, record_batch: pa.RecordBatch, check_overflow: bool
    ) -> Iterator[StoredMessage]:
        bodies = record_batch.column("body").to_pylist()
        prev_links = record_batch.column("prev_link").to_pylist()
        links = record_batch.column("chain_link").to_pylist()
        keys = record_batch.column("batch_key").to_pylist()
        for i, record in enumerate(chain_records(record_batch)):
            body = bodies[i] or b""
            aside = None
            if record.body_location is not None and check_overflow:
                aside = self._aside_sha256(record.body_location)
            yield StoredMessage(
                batch_key=str(keys[i]),
                record=record,
                prev_link=str(prev_links[i]),
                chain_link=str(links[i]),
                row_body_size=len(body),
                row_body_sha256=hashlib.sha256(body).hexdigest(),
                aside_body_sha256=aside,
            )

    def restored_body(self, location: str, size: int, sha256: str, max_bytes: int) -> bytes | None:
        """The bytes of a body moved aside at intake, when they fit `max_bytes` now (the bound
        was raised since: a replay of its `too-large` dead letter then classifies the message
        itself) and its overflow file still holds exactly them; None otherwise."""
        path = self._overflow_path(location)
        if size > max_bytes or path is None:
            return None
        try:
            with open(path, "rb") as f:
                body = f.read(max_bytes + 1)
        except OSError:
            return None
        if len(body) != size or hashlib.sha256(body).hexdigest() != sha256:
            return None
        return body

    def _overflow_path(self, location: str) -> Path | None:
        """The file a logged body location names, when it lies inside overflow/ (a location is
        data read back from the log: it must not lead anywhere else)."""
        path = (self.root / location).resolve()
        return path if path.is_relative_to(self.overflow_dir.resolve()) else None

    def _aside_sha256(self, location: str) -> str:
        path = self._overflow_path(location)
        if path is None or not path.is_file():
            return ""
        return file_sha256(path)

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
