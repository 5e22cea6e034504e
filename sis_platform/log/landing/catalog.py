"""`Catalog`: what a landing zone holds, for readers: which batches are landed, the end of the
log and the last landed position, each batch's anchor and what its files claim (fence token,
lease holder, why it ended), and a batch's rows read back (whole, counted, as stored messages
for the chain's verification, or the log from a position on for a fold).

A batch in parts is sealed, and only then counts as landed (`keys`), when its anchor
`anchors/<key>.json` exists; a one-file batch is landed once its file is claimed (its anchor
follows right after, or is restored by `ZoneWriter.ensure_anchor`). Batches the expiry record
covers are gone (sis_platform/log/landing/expiry.py). Nothing here writes to the zone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sis_platform.domain.limits import Limits
from sis_platform.log.chain import GENESIS_LINK, Anchor, StoredMessage, file_sha256
from sis_platform.log.landing.expiry import BatchExpired, reading_from
from sis_platform.log.landing.groups import open_batch_of
from sis_platform.log.landing.layout import ZoneLayout
from sis_platform.log.landing.reading import LandedMessage, landed_after
from sis_platform.log.landing.rows import (
    BATCH_KEY_RE,
    CLOSED_BY_KEY,
    FENCE_TOKEN_KEY,
    LANDING_SCHEMA,
    LEASE_HOLDER_KEY,
    READ_ROWS,
    SEAL_RECORD,
    START_POSITION,
    ClosedBy,
    LogPosition,
    OpenBatch,
    anchor_of,
    batch_key,
    batch_seq_of,
    chain_records,
)
from sis_platform.log.landing.signing import AnchorSigner


class Tail(NamedTuple):
    """The end of the log: the last batch's number (0: none), the link after its last message,
    how many messages it holds, and the batch itself when it is open (landed in parts, not
    sealed)."""

    seq: int
    head: bytes
    messages: int
    open: OpenBatch | None


class BatchFigures(NamedTuple):
    """What a landed batch holds, counted (raw_messages reports them)."""

    messages: int
    body_bytes: int  # bodies held in the batch (a body moved aside holds none)
    moved_aside: int  # bodies intake moved aside
    redelivered: int  # messages delivered more than once
    first_put: datetime | None  # the earliest put time (None: no message has one)
    last_put: datetime | None

    @staticmethod
    def total(figures: Sequence[BatchFigures]) -> BatchFigures:
        """The figures of several batches together (a run over a range of them)."""
        firsts = [f.first_put for f in figures if f.first_put is not None]
        lasts = [f.last_put for f in figures if f.last_put is not None]
        return BatchFigures(
            sum(f.messages for f in figures),
            sum(f.body_bytes for f in figures),
            sum(f.moved_aside for f in figures),
            sum(f.redelivered for f in figures),
            min(firsts, default=None),
            max(lasts, default=None),
        )


class Catalog(ZoneLayout):
    """The landed batches under `root`, read. `signer`: the zone's anchor signer, whose log key
    verifiers check the anchors with (an unsigned one without a seal)."""

    def __init__(self, root: Path, signer: AnchorSigner | None = None) -> None:
        super().__init__(root)
        self.signer = signer if signer is not None else AnchorSigner()

    # -- which batches there are ------------------------------------------------------------

    def keys(self) -> list[str]:
        """Every landed batch key, in landing order: each one-file batch, and each batch in
        parts once it is sealed (a batch still open is not landed yet)."""
        if not self.batches_dir.is_dir():
            return []
        files, folders = self.listing()
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

    def tail(self) -> Tail:
        """The end of the log, open batch included, read with one listing of the zone.

        The last batch is the latest of the landing files, the batch folders holding a part
        and the anchors: a batch whose file was removed keeps its number and its head, so the
        next batch follows it and the loss shows as a missing batch instead of being papered
        over."""
        files, folders = self.listing()
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
        """The tail at batch `key`'s file when it has no anchor yet (a crash between the file
        and its anchor): the anchor every landing file carries in its metadata. A file without
        one was not written by the landing zone (nor by any version of it a deployment holds):
        it is refused, not read, whatever its size."""
        claimed = self.anchor_from_file(key)
        if claimed is None:
            raise ValueError(
                f"{self.batch_path(key)} has no anchor file and no chain metadata: it is not a "
                "landing file. Move it out of the landing zone (or restore the batch from a "
                "backup) before starting again"
            )
        return Tail(batch_seq_of(key), bytes.fromhex(claimed.head), claimed.messages, None)

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
        return self.batch_dir(key) if self.is_segmented(key) else self.batch_path(key)

    # -- what a batch's files claim ---------------------------------------------------------

    def _metadata(self, key: str) -> dict[bytes, bytes]:
        """The Parquet key-value metadata of the batch's file, or of its last part."""
        files = self.landed_files(key)
        return pq.read_schema(files[-1]).metadata or {}

    def anchor_from_file(self, key: str) -> Anchor | None:
        """The anchor the landing file's own metadata claims, or for a batch in parts its last
        part's (None: not a landing file)."""
        return anchor_of(key, self._metadata(key))

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
        if self.is_segmented(key):
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
            columns = ["body", "body_location", "delivery_count", "put_time"]
            for rows in parquet.iter_batches(batch_size=READ_ROWS, columns=columns):
                messages += rows.num_rows
                body_bytes += pc.sum(pc.binary_length(rows.column("body"))).as_py() or 0
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
        path = self.overflow_path(location)
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

    def _aside_sha256(self, location: str) -> str:
        path = self.overflow_path(location)
        if path is None or not path.is_file():
            return ""
        return file_sha256(path)
