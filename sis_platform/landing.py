"""The landing zone: immutable, durable batches of raw messages, the platform's source of truth.

Intake gets messages under syncpoint, writes them here as one batch and only then commits
the queue's unit of work (docs/design.md invariant 1, "No loss"). A batch file is written to a
temporary name, fsync'd, atomically renamed into place and its folder fsync'd, so after a crash
a batch either exists whole or not at all. Everything downstream is a pure function of these
files, which is what makes partitions re-materializable without touching the queue.

Batches are numbered 1, 2, 3, ... with no gaps; the batch key is that number zero-padded to ten
digits, so that keys sort in landing order (they are Dagster partition keys). A batch file is
claimed with a hard link, which fails rather than overwrite if another consumer landed the same
number first.

With a consumer lease (`sis_platform.lease`), `land` takes a `Fence`: the claim happens under
the lease lock and only while the caller's fencing token is current, so a holder that lost the
lease lands nothing (`FencedOff`). The token and holder are recorded in the batch file's
Parquet key-value metadata (`sis:fence_token`, `sis:lease_holder`).

Each message carries a hash chain link over every logged field (sis_platform/logchain.py),
starting from the last link of the previous batch (32 zero bytes for the first batch). The
chain's head is anchored in the file's metadata (`sis:chain_head`, `sis:chain_first_prev`,
`sis:messages`, `sis:chain_format`) and, right after the claim and under the same fence, in an
append-only anchor file `anchors/<key>.json` (why there: logchain.py).

A body over the per-message bound (SIS_MAX_MESSAGE_BYTES) never enters a batch: `move_aside`
writes it durably to `overflow/<sha256>.body` (content-addressed, mode 0600) and the batch holds
a row with an empty body, the real size and digest, and that file's path (`body_location`).

No Dagster or Spark import: intake (sis_platform/intake.py) uses this in the sensor's process,
which must stay light.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from sis_platform.faults import crash_point
from sis_platform.logchain import (
    CHAIN_FORMAT,
    Anchor,
    AnchorStore,
    ChainRecord,
    StoredMessage,
    chain_link,
    fsync_dir,
)
from sis_platform.logchain import GENESIS_LINK as GENESIS_LINK
from sis_platform.queues.base import ReceivedMessage

if TYPE_CHECKING:
    from sis_platform.lease import Fence

BATCH_KEY_RE = re.compile(r"^\d{10}$")
FENCE_TOKEN_KEY = b"sis:fence_token"
LEASE_HOLDER_KEY = b"sis:lease_holder"
CLOSED_BY_KEY = b"sis:closed_by"
CHAIN_FORMAT_KEY = b"sis:chain_format"
CHAIN_HEAD_KEY = b"sis:chain_head"
CHAIN_FIRST_PREV_KEY = b"sis:chain_first_prev"
MESSAGES_KEY = b"sis:messages"
_READ_ROWS = 1024  # rows per Arrow batch when a landing file is read back for verification


class ClosedBy(StrEnum):
    """Why a landing batch ended: one of its bounds, or the queue ran dry."""

    MESSAGES = "messages"  # SIS_BATCH_MAX_MESSAGES reached
    BYTES = "bytes"  # SIS_BATCH_MAX_BYTES reached
    SECONDS = "seconds"  # SIS_BATCH_MAX_SECONDS passed with messages still arriving
    DRAINED = "drained"  # a get waited SIS_GET_WAIT_SECONDS and found no message


LANDING_SCHEMA = pa.schema(
    [
        pa.field("batch_key", pa.string(), nullable=False),
        pa.field("batch_seq", pa.int64(), nullable=False),
        pa.field("msg_seq", pa.int32(), nullable=False),
        pa.field("message_id", pa.string(), nullable=False),
        pa.field("put_time", pa.timestamp("us", tz="UTC")),
        pa.field("received_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("delivery_count", pa.int32(), nullable=False),
        pa.field("properties_json", pa.string()),
        pa.field("body", pa.binary(), nullable=False),
        pa.field("body_sha256", pa.string(), nullable=False),
        # The real body's size; the body column is empty when it was moved aside.
        pa.field("body_size", pa.int64(), nullable=False),
        # Where a moved-aside body lies, relative to the landing root (None: in `body`).
        pa.field("body_location", pa.string()),
        pa.field("prev_link", pa.string(), nullable=False),
        pa.field("chain_link", pa.string(), nullable=False),
    ]
)
_UNLINKED_SCHEMA = pa.schema([f for f in LANDING_SCHEMA if not f.name.endswith("_link")])


def batch_key(seq: int) -> str:
    return f"{seq:010d}"


def batch_seq_of(key: str) -> int:
    if BATCH_KEY_RE.match(key) is None:
        raise ValueError(f"not a batch key: {key!r} (expected ten digits)")
    return int(key)


@dataclass(frozen=True)
class OverflowBody:
    """A body moved aside at intake: its size, sha256 (hex) and file relative to the root."""

    size: int
    sha256: str
    location: str


@dataclass(frozen=True)
class MovedAside:
    """A message whose body is in an overflow file; `message.body` is empty."""

    message: ReceivedMessage
    body: OverflowBody


@dataclass(frozen=True)
class LandedBatch:
    key: str
    seq: int
    path: Path
    messages: int
    bytes: int  # body bytes held in the batch (moved-aside bodies not counted)
    last_link: str  # hex
    fence_token: int | None = None  # None: landed without a consumer lease
    closed_by: ClosedBy | None = None  # None: not recorded (landed by hand, or before it was)


class LandingZone:
    """Batches under `root/batches/`, one Parquet file each, named by batch key; their anchors
    under `root/anchors/`; bodies moved aside under `root/overflow/`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.batches_dir = self.root / "batches"
        self.tmp_dir = self.root / "tmp"
        self.overflow_dir = self.root / "overflow"
        self.anchors = AnchorStore(self.root / "anchors")

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

    def batch_path(self, key: str) -> Path:
        return self.batches_dir / f"{key}.parquet"

    def keys(self) -> list[str]:
        """Every landed batch key, in landing order."""
        if not self.batches_dir.is_dir():
            return []
        keys = [p.stem for p in self.batches_dir.glob("*.parquet") if BATCH_KEY_RE.match(p.stem)]
        return sorted(keys)

    def keys_after(self, seq: int) -> list[str]:
        return [k for k in self.keys() if batch_seq_of(k) > seq]

    def last(self) -> tuple[int, bytes]:
        """The last batch's number and final chain link (0 and the genesis link when empty).

        The last batch is the later of the last landing file and the last anchor: a batch whose
        file was removed keeps its number and its head, so the next batch follows it and the
        loss shows as a missing batch instead of being papered over."""
        keys = self.keys()
        anchored = [k for k in self.anchors.keys() if BATCH_KEY_RE.match(k)]
        last_key = max(keys[-1:] + anchored[-1:], default=None)
        if last_key is None:
            return 0, GENESIS_LINK
        anchor = self.anchors.read(last_key)
        if anchor is not None:
            return batch_seq_of(last_key), bytes.fromhex(anchor.head)
        table = pq.read_table(self.batch_path(last_key), columns=["chain_link"])
        return batch_seq_of(last_key), bytes.fromhex(table.column("chain_link")[-1].as_py())

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
        """Write `messages` as the next batch, durably, with its anchor. Returns once both are
        on disk.

        With `fence`, the batch is claimed (and anchored) only while the fence's token is the
        lease's current token (checked under the lease lock right before the claim); otherwise
        `FencedOff` is raised and nothing is landed. `closed_by` (why the batch ended) is kept
        with it."""
        if not messages:
            raise ValueError("a landing batch needs at least one message")
        self.ensure()
        landed_at = now or datetime.now(UTC)
        prev_seq, first_prev = self.last()
        seq = prev_seq + 1
        key = batch_key(seq)
        columns: dict[str, list[object]] = {f.name: [] for f in _UNLINKED_SCHEMA}
        total = 0
        for i, item in enumerate(messages):
            m = item.message if isinstance(item, MovedAside) else item
            if isinstance(item, MovedAside):
                size, digest, location = item.body.size, item.body.sha256, item.body.location
            else:
                size, digest, location = len(m.body), hashlib.sha256(m.body).hexdigest(), None
            total += len(m.body)
            row: dict[str, object] = {
                "batch_key": key,
                "batch_seq": seq,
                "msg_seq": i,
                "message_id": m.message_id,
                "put_time": m.put_time,
                "received_at": landed_at,
                "delivery_count": m.delivery_count,
                "properties_json": json.dumps(dict(m.properties), sort_keys=True, default=str)
                if m.properties
                else None,
                "body": m.body,
                "body_sha256": digest,
                "body_size": size,
                "body_location": location,
            }
            for name, value in row.items():
                columns[name].append(value)
        unlinked = pa.Table.from_pydict(columns, schema=_UNLINKED_SCHEMA)
        # Links are computed from the Arrow columns, exactly as a verifier reads them back.
        prev_links: list[str] = []
        links: list[str] = []
        link = first_prev
        for record_batch in unlinked.to_batches():
            for record in _records(record_batch):
                prev_links.append(link.hex())
                link = chain_link(link, record)
                links.append(link.hex())
        table = unlinked.append_column(
            LANDING_SCHEMA.field("prev_link"), pa.array(prev_links, pa.string())
        ).append_column(LANDING_SCHEMA.field("chain_link"), pa.array(links, pa.string()))
        anchor = Anchor(key, len(messages), first_prev.hex(), link.hex())
        metadata: dict[bytes, bytes] = {
            CHAIN_FORMAT_KEY: str(CHAIN_FORMAT).encode(),
            CHAIN_HEAD_KEY: anchor.head.encode(),
            CHAIN_FIRST_PREV_KEY: anchor.first_prev.encode(),
            MESSAGES_KEY: str(anchor.messages).encode(),
        }
        if fence is not None:
            metadata[FENCE_TOKEN_KEY] = str(fence.token).encode()
            metadata[LEASE_HOLDER_KEY] = fence.holder.encode()
        if closed_by is not None:
            metadata[CLOSED_BY_KEY] = ClosedBy(closed_by).value.encode()
        table = table.replace_schema_metadata(metadata)
        final = self.batch_path(key)
        # Unique across hosts: production and disaster recovery share this folder.
        tmp = self.tmp_dir / f"{key}.parquet.{uuid.uuid4().hex}.partial"
        # Written and fsync'd through one descriptor: if a new lease holder cleans up our partial
        # file meanwhile, we still reach the fence check and are told why (FencedOff).
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            pq.write_table(table, f, compression="zstd")
            f.flush()
            os.fsync(f.fileno())
        crash_point("landing.before_claim")
        try:
            if fence is None:
                self._claim(tmp, final, anchor)
            else:
                with fence.held():
                    self._claim(tmp, final, anchor)
        finally:
            tmp.unlink(missing_ok=True)
        token = fence.token if fence is not None else None
        return LandedBatch(key, seq, final, len(messages), total, link.hex(), token, closed_by)

    def _claim(self, tmp: Path, final: Path, anchor: Anchor) -> None:
        # link() never overwrites: if two consumers raced for this number (the consumer lease
        # exists to prevent it), the second fails here instead of replacing a batch.
        os.link(tmp, final)
        fsync_dir(self.batches_dir)
        self.anchors.write(anchor)

    def anchor_from_file(self, key: str) -> Anchor | None:
        """The anchor the landing file's own metadata claims (None: written before chain
        format 2, or not a landing file)."""
        metadata = pq.read_schema(self.batch_path(key)).metadata or {}
        try:
            return Anchor(
                batch_key=key,
                messages=int(metadata[MESSAGES_KEY]),
                first_prev=metadata[CHAIN_FIRST_PREV_KEY].decode(),
                head=metadata[CHAIN_HEAD_KEY].decode(),
                format=int(metadata[CHAIN_FORMAT_KEY]),
            )
        except (KeyError, ValueError):
            return None

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
        and the anchor left it without one (intake calls this before handing a batch on).
        None when the file carries no chain metadata either."""
        anchor = self.anchors.read(key)
        if anchor is not None:
            return anchor
        anchor = self.anchor_from_file(key)
        if anchor is not None:
            try:
                self.anchors.write(anchor)
            except FileExistsError:  # written meanwhile: the one on disk is the anchor
                return self.anchors.read(key)
        return anchor

    def stored_messages(self, key: str, *, check_overflow: bool = True) -> Iterator[StoredMessage]:
        """The batch's messages as its landing file holds them, read a few rows at a time, each
        body hashed again (and a moved-aside body's file when `check_overflow`)."""
        parquet = pq.ParquetFile(self.batch_path(key))
        for record_batch in parquet.iter_batches(batch_size=_READ_ROWS):
            bodies = record_batch.column("body").to_pylist()
            prev_links = record_batch.column("prev_link").to_pylist()
            links = record_batch.column("chain_link").to_pylist()
            keys = record_batch.column("batch_key").to_pylist()
            for i, record in enumerate(_records(record_batch)):
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
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()

    def fence_token(self, key: str) -> int | None:
        """The fencing token the batch was landed under (None: landed without a lease)."""
        metadata = pq.read_schema(self.batch_path(key)).metadata or {}
        raw = metadata.get(FENCE_TOKEN_KEY)
        return int(raw) if raw is not None else None

    def lease_holder(self, key: str) -> str | None:
        """Who landed the batch, when it was landed under a consumer lease."""
        metadata = pq.read_schema(self.batch_path(key)).metadata or {}
        raw = metadata.get(LEASE_HOLDER_KEY)
        return raw.decode() if raw is not None else None

    def closed_by(self, key: str) -> ClosedBy | None:
        """Why the batch ended (None: not recorded)."""
        metadata = pq.read_schema(self.batch_path(key)).metadata or {}
        raw = metadata.get(CLOSED_BY_KEY)
        return ClosedBy(raw.decode()) if raw is not None else None

    def read(self, key: str) -> pa.Table:
        return pq.read_table(self.batch_path(key), schema=LANDING_SCHEMA)

    def iter_messages(self) -> Iterator[dict[str, object]]:
        """Every landed message in landing order (for tests, trace and the reference check)."""
        for key in self.keys():
            yield from self.read(key).to_pylist()

    def clean_partials(self) -> int:
        """Remove temporary files left by a crash mid-write; they never became batches."""
        removed = 0
        if self.tmp_dir.is_dir():
            for p in self.tmp_dir.glob("*.partial"):
                p.unlink(missing_ok=True)
                removed += 1
        return removed


def _records(batch: pa.RecordBatch) -> Iterator[ChainRecord]:
    """The chain records of Arrow rows in the landing schema (timestamps as microseconds)."""
    columns = {
        name: batch.column(name).to_pylist()
        for name in (
            "batch_seq",
            "msg_seq",
            "message_id",
            "delivery_count",
            "properties_json",
            "body_size",
            "body_sha256",
            "body_location",
        )
    }
    put_us = batch.column("put_time").cast(pa.int64()).to_pylist()
    received_us = batch.column("received_at").cast(pa.int64()).to_pylist()
    for i in range(batch.num_rows):
        yield ChainRecord(
            batch_seq=int(columns["batch_seq"][i]),
            msg_seq=int(columns["msg_seq"][i]),
            message_id=str(columns["message_id"][i]),
            put_time_us=put_us[i],
            received_at_us=int(received_us[i]),
            delivery_count=int(columns["delivery_count"][i]),
            properties_json=columns["properties_json"][i],
            body_size=int(columns["body_size"][i]),
            body_sha256=str(columns["body_sha256"][i]),
            body_location=columns["body_location"][i],
        )
