"""The landing zone's records and rows: batch keys, log positions, the landing schema, and the one
implementation that turns received messages into linked rows and writes them durably.

`ZoneWriter.land` (one file per batch) and `GroupWriter.land` (a batch in parts) both build
their rows with `linked_rows` and write them with `write_partial`, so a batch landed in groups
holds exactly the rows (all but `received_at`, which is per group) and links of the same
messages landed as one file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from sis_platform.log.chain import CHAIN_FORMAT, Anchor, ChainRecord, chain_link
from sis_platform.log.position import START_POSITION as START_POSITION
from sis_platform.log.position import LogPosition as LogPosition
from sis_platform.queues.base import ReceivedMessage

BATCH_KEY_RE = re.compile(r"^\d{10}$")
PART_RE = re.compile(r"^part-(\d{5,})\.parquet$")
# A landing file's row groups hold about this many bytes of Arrow data (~0.7 MB compressed for
# the simulated feed). Spark splits a file between tasks only at row-group boundaries: a
# 50,000-message batch file in one row group was read by one task, which then wrote the batch's
# rows in raw_messages as one file, so every later read of the batch (the chain check,
# classification) ran on one core too. In row groups of this size a full batch is read by as
# many tasks as there are cores, and so are the reads after it. A live part of a few messages
# is one row group.
ROW_GROUP_BYTES = 4 * 1024 * 1024
SEAL_RECORD = "_seal.json"  # in a segmented batch's folder; "_": Spark skips it in a folder
FENCE_TOKEN_KEY = b"sis:fence_token"
LEASE_HOLDER_KEY = b"sis:lease_holder"
CLOSED_BY_KEY = b"sis:closed_by"
CHAIN_FORMAT_KEY = b"sis:chain_format"
CHAIN_HEAD_KEY = b"sis:chain_head"
CHAIN_FIRST_PREV_KEY = b"sis:chain_first_prev"
MESSAGES_KEY = b"sis:messages"
# The anchor's (a part: its running anchor's) signature with the log key, and the key's id.
CHAIN_SIGNATURE_KEY = b"sis:chain_signature"
CHAIN_KEY_ID_KEY = b"sis:chain_key_id"
# A part's running totals besides the anchor fields: enough to seal or reopen its batch.
PART_KEY = b"sis:part"
BYTES_KEY = b"sis:bytes"
OPENED_AT_KEY = b"sis:opened_at"
READ_ROWS = 1024  # rows per Arrow batch when a landing file is read back


class ClosedBy(StrEnum):
    """Why a landing batch ended: one of its bounds, or the queue ran dry."""

    MESSAGES = "messages"  # SIS_BATCH_MAX_MESSAGES reached
    BYTES = "bytes"  # SIS_BATCH_MAX_BYTES reached
    SECONDS = "seconds"  # SIS_BATCH_MAX_SECONDS passed with messages still arriving
    DRAINED = "drained"  # a get waited SIS_GET_WAIT_SECONDS and found no message
    # Left open by a crash or an earlier lease holder, sealed by the next one (GroupWriter).
    RECOVERED = "recovered"


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


def part_name(part: int) -> str:
    return f"part-{part:05d}.parquet"


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
    path: Path  # the batch file, or the folder of a batch landed in parts
    messages: int
    bytes: int  # body bytes held in the batch (moved-aside bodies not counted)
    last_link: str  # hex
    fence_token: int | None = None  # None: landed without a consumer lease
    closed_by: ClosedBy | None = None  # None: not recorded (landed by hand, or before it was)


@dataclass(frozen=True)
class LandedGroup:
    """One group landed as a part of the open batch: `messages` messages from `first_msg_seq`."""

    batch_key: str
    batch_seq: int
    part: int
    first_msg_seq: int
    messages: int
    bytes: int  # body bytes held in this part
    last_link: str  # hex: the chain head after this part
    path: Path

    @property
    def last_position(self) -> LogPosition:
        return LogPosition(self.batch_seq, self.first_msg_seq + self.messages - 1)


@dataclass(frozen=True)
class OpenBatch:
    """A batch being landed in parts and not sealed yet: what its parts hold so far."""

    key: str
    seq: int
    messages: int
    bytes: int
    parts: int  # parts landed; the next one is numbered `parts`
    opened_at: datetime  # UTC: when its first part was landed
    first_prev: str  # hex: the link its first message follows
    head: str  # hex: the link after its last message so far


class LinkedRows(NamedTuple):
    """Messages as landing rows with their links: the table, the link after its last row and
    the body bytes it holds."""

    table: pa.Table
    head: bytes
    bytes: int


def linked_rows(
    messages: Sequence[ReceivedMessage | MovedAside],
    *,
    key: str,
    seq: int,
    first_msg_seq: int,
    prev: bytes,
    received_at: datetime,
) -> LinkedRows:
    """`messages` as rows of batch `seq` numbered from `first_msg_seq`, chained from `prev`."""
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
            "msg_seq": first_msg_seq + i,
            "message_id": m.message_id,
            "put_time": m.put_time,
            "received_at": received_at,
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
    link = prev
    for record_batch in unlinked.to_batches():
        for record in chain_records(record_batch):
            prev_links.append(link.hex())
            link = chain_link(link, record)
            links.append(link.hex())
    table = unlinked.append_column(
        LANDING_SCHEMA.field("prev_link"), pa.array(prev_links, pa.string())
    ).append_column(LANDING_SCHEMA.field("chain_link"), pa.array(links, pa.string()))
    return LinkedRows(table, link, total)


def warm() -> None:
    """Pay landing's one-off cost now: the first array pyarrow builds from Python objects
    imports pandas (pyarrow checks such input for pandas objects), about half a second that
    would otherwise fall on a process's first landed message."""
    pa.array([""], pa.string())


def anchor_metadata(anchor: Anchor) -> dict[bytes, bytes]:
    """The chain fields a landing file carries: for a batch file its anchor, for a part the
    running anchor of its batch (messages so far, the batch's first link, the head so far)."""
    metadata = {
        CHAIN_FORMAT_KEY: str(CHAIN_FORMAT).encode(),
        CHAIN_HEAD_KEY: anchor.head.encode(),
        CHAIN_FIRST_PREV_KEY: anchor.first_prev.encode(),
        MESSAGES_KEY: str(anchor.messages).encode(),
    }
    if anchor.signature is not None and anchor.key_id is not None:
        metadata[CHAIN_SIGNATURE_KEY] = anchor.signature.encode()
        metadata[CHAIN_KEY_ID_KEY] = anchor.key_id.encode()
    return metadata


def anchor_of(key: str, metadata: dict[bytes, bytes]) -> Anchor | None:
    """The (running) anchor a landing file's metadata claims; None without chain metadata."""
    try:
        return Anchor(
            batch_key=key,
            messages=int(metadata[MESSAGES_KEY]),
            first_prev=metadata[CHAIN_FIRST_PREV_KEY].decode(),
            head=metadata[CHAIN_HEAD_KEY].decode(),
            format=int(metadata[CHAIN_FORMAT_KEY]),
            signature=_optional_text(metadata.get(CHAIN_SIGNATURE_KEY)),
            key_id=_optional_text(metadata.get(CHAIN_KEY_ID_KEY)),
        )
    except (KeyError, ValueError):
        return None


def _optional_text(raw: bytes | None) -> str | None:
    return raw.decode() if raw is not None else None


def rows_per_group(table: pa.Table) -> int:
    """How many of `table`'s rows make a row group of about ROW_GROUP_BYTES (in memory)."""
    return max(1, table.num_rows * ROW_GROUP_BYTES // max(1, table.nbytes))


def write_partial(table: pa.Table, tmp_dir: Path, name: str) -> Path:
    """Write `table` to a new file in `tmp_dir` (mode 0600), fsync'd; its path. A write that
    fails (a full disk) removes what it wrote."""
    # Unique across hosts: production and disaster recovery share the folder.
    tmp = tmp_dir / f"{name}.{uuid.uuid4().hex}.partial"
    # Written and fsync'd through one descriptor: if a new lease holder cleans up the partial
    # file meanwhile, the writer still reaches its fence check and is told why (FencedOff).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _write_parquet(table, fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _write_parquet(table: pa.Table, fd: int) -> None:
    """Write `table` as Parquet to the open descriptor `fd`, fsync it and close it."""
    with os.fdopen(fd, "wb") as f:
        # No dictionary pages and no column statistics: a landing file is always read whole,
        # and both cost time and space on the live path's one-message parts (about a third of
        # a lone message's part, in bytes and in time).
        pq.write_table(
            table,
            f,
            row_group_size=rows_per_group(table),
            compression="zstd",
            use_dictionary=False,
            write_statistics=False,
        )
        f.flush()
        os.fsync(f.fileno())


def landing_bytes_bound(messages: int, body_bytes: int) -> int:
    """The most disk space landing `messages` whose bodies hold `body_bytes` in all can take:
    the bodies uncompressed, each row's own fields (links, ids, times, properties) and the
    file's footer, with a margin. Checked before getting a group (a full disk must stop intake
    before a get, not after: every backout counts a delivery)."""
    return body_bytes + messages * LANDING_ROW_BYTES + LANDING_FILE_BYTES


# A row's fields besides its body (two 64-character links, the message id, times, delivery
# count, properties as JSON, digest): a few hundred bytes in the feed; bounded generously.
LANDING_ROW_BYTES = 2048
# A landing file's footer and metadata, the seal record and the anchor, with a margin.
LANDING_FILE_BYTES = 256 * 1024


def chain_records(batch: pa.RecordBatch) -> Iterator[ChainRecord]:
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
