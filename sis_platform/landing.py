"""The landing zone: immutable, durable batches of raw messages, the platform's source of truth.

The sensor gets messages under syncpoint, writes them here as one batch and only then commits
the queue's unit of work (DESIGN.md invariant 1, "No loss"). A batch file is written to a
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

Each message carries a hash chain link,
chain = sha256(previous chain || message id || sha256(body)),
starting from the last link of the previous batch (32 zero bytes for the first batch), so that
deleting, inserting, reordering or changing a logged message is detectable.

No Dagster or Spark import: the sensor process uses this and must stay light.
"""

from __future__ import annotations

import hashlib
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
from sis_platform.queues.base import ReceivedMessage

if TYPE_CHECKING:
    from sis_platform.lease import Fence

GENESIS_LINK = bytes(32)
BATCH_KEY_RE = re.compile(r"^\d{10}$")
FENCE_TOKEN_KEY = b"sis:fence_token"
LEASE_HOLDER_KEY = b"sis:lease_holder"
CLOSED_BY_KEY = b"sis:closed_by"


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
        pa.field("prev_link", pa.string(), nullable=False),
        pa.field("chain_link", pa.string(), nullable=False),
    ]
)


def chain_link(previous: bytes, message_id: str, body_sha256: bytes) -> bytes:
    return hashlib.sha256(previous + message_id.encode("utf-8") + body_sha256).digest()


def batch_key(seq: int) -> str:
    return f"{seq:010d}"


def batch_seq_of(key: str) -> int:
    if BATCH_KEY_RE.match(key) is None:
        raise ValueError(f"not a batch key: {key!r} (expected ten digits)")
    return int(key)


@dataclass(frozen=True)
class LandedBatch:
    key: str
    seq: int
    path: Path
    messages: int
    bytes: int
    last_link: str  # hex
    fence_token: int | None = None  # None: landed without a consumer lease
    closed_by: ClosedBy | None = None  # None: not recorded (landed by hand, or before it was)


class LandingZone:
    """Batches under `root/batches/`, one Parquet file each, named by batch key."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.batches_dir = self.root / "batches"
        self.tmp_dir = self.root / "tmp"

    def ensure(self) -> None:
        self.batches_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

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
        """The last batch's number and final chain link (0 and the genesis link when empty)."""
        keys = self.keys()
        if not keys:
            return 0, GENESIS_LINK
        key = keys[-1]
        table = pq.read_table(self.batch_path(key), columns=["chain_link"])
        return batch_seq_of(key), bytes.fromhex(table.column("chain_link")[-1].as_py())

    def land(
        self,
        messages: Sequence[ReceivedMessage],
        *,
        now: datetime | None = None,
        fence: Fence | None = None,
        closed_by: ClosedBy | None = None,
    ) -> LandedBatch:
        """Write `messages` as the next batch, durably. Returns once the batch is on disk.

        With `fence`, the batch is claimed only while the fence's token is the lease's current
        token (checked under the lease lock right before the claim); otherwise `FencedOff` is
        raised and nothing is landed. `closed_by` (why the batch ended) is kept with it."""
        if not messages:
            raise ValueError("a landing batch needs at least one message")
        import json

        self.ensure()
        landed_at = now or datetime.now(UTC)
        prev_seq, link = self.last()
        seq = prev_seq + 1
        key = batch_key(seq)
        columns: dict[str, list[object]] = {f.name: [] for f in LANDING_SCHEMA}
        total = 0
        for i, m in enumerate(messages):
            digest = hashlib.sha256(m.body).digest()
            prev = link
            link = chain_link(prev, m.message_id, digest)
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
                "body_sha256": digest.hex(),
                "prev_link": prev.hex(),
                "chain_link": link.hex(),
            }
            for name, value in row.items():
                columns[name].append(value)
        table = pa.Table.from_pydict(columns, schema=LANDING_SCHEMA)
        metadata: dict[bytes, bytes] = {}
        if fence is not None:
            metadata[FENCE_TOKEN_KEY] = str(fence.token).encode()
            metadata[LEASE_HOLDER_KEY] = fence.holder.encode()
        if closed_by is not None:
            metadata[CLOSED_BY_KEY] = ClosedBy(closed_by).value.encode()
        if metadata:
            table = table.replace_schema_metadata(metadata)
        final = self.batch_path(key)
        # Unique across hosts: production and disaster recovery share this folder.
        tmp = self.tmp_dir / f"{key}.parquet.{uuid.uuid4().hex}.partial"
        # Written and fsync'd through one descriptor: if a new lease holder cleans up our partial
        # file meanwhile, we still reach the fence check and are told why (FencedOff).
        with open(tmp, "wb") as f:
            pq.write_table(table, f, compression="zstd")
            f.flush()
            os.fsync(f.fileno())
        crash_point("landing.before_claim")
        try:
            if fence is None:
                _claim(tmp, final)
            else:
                with fence.held():
                    _claim(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(self.batches_dir)
        token = fence.token if fence is not None else None
        return LandedBatch(key, seq, final, len(messages), total, link.hex(), token, closed_by)

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


def _claim(tmp: Path, final: Path) -> None:
    # link() never overwrites: if two consumers raced for this number (the consumer lease
    # exists to prevent it), the second fails here instead of replacing a batch.
    os.link(tmp, final)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
