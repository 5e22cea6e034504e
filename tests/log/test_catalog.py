"""The landing zone's catalog on its own: a reader opens a `Catalog` without a writer, reads
every form of batch, and leaves the zone exactly as it found it."""

from __future__ import annotations

import dataclasses
import os
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sis_platform.domain.limits import DEFAULT_LIMITS
from sis_platform.log.landing import (
    START_POSITION,
    Catalog,
    ClosedBy,
    GroupWriter,
    LandingZone,
    MovedAside,
    batch_key,
)
from sis_platform.queues.base import ReceivedMessage, new_message_id

NOW = datetime(2026, 11, 21, 14, 30, tzinfo=UTC)


def _messages(n: int, start: int = 0) -> list[ReceivedMessage]:
    return [
        ReceivedMessage(new_message_id(), f"<m n='{start + i}'/>".encode(), NOW, 1)
        for i in range(n)
    ]


def _snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every file and folder under `root`: its mode, size and modification time (ns)."""
    found: dict[str, tuple[int, int, int]] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            st = path.stat()
            found[str(path.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return found


def test_a_catalog_reads_every_form_of_batch_and_writes_nothing(tmp_path):
    zone = LandingZone(tmp_path)
    big = b"<m>" + b"x" * 200 + b"</m>"
    aside = zone.writer.move_aside(big)
    message = dataclasses.replace(_messages(1)[0], body=b"")
    whole = zone.writer.land([MovedAside(message, aside), *_messages(2, 1)])
    writer = GroupWriter(zone.writer)
    for i in range(3):
        writer.land(_messages(2, 10 + 2 * i))
    sealed = writer.seal(ClosedBy.MESSAGES)
    writer.land(_messages(1, 20))  # batch 3 stays open
    assert sealed is not None
    before = _snapshot(tmp_path)

    catalog = Catalog(tmp_path)  # a reader's own: no writer, no seal
    assert catalog.keys() == [whole.key, sealed.key] == catalog.keys_after(0)
    assert catalog.sealed_after(0, 10) == [whole.key, sealed.key]
    tail = catalog.tail()
    assert tail.seq == 3 and tail.open is not None and tail.open.messages == 1
    assert catalog.last_position() == (3, 0)
    landed = list(catalog.landed_after(START_POSITION, DEFAULT_LIMITS))
    assert [m.position for m in landed] == (
        [(1, n) for n in range(3)] + [(2, n) for n in range(6)] + [(3, 0)]
    )
    for key in (whole.key, sealed.key):
        anchor = catalog.anchor(key)
        assert anchor is not None and catalog.anchor_from_file(key) == anchor
        assert catalog.fence_token(key) is None and catalog.lease_holder(key) is None
        assert len(list(catalog.stored_messages(key))) == anchor.messages
        assert catalog.figures(key).messages == catalog.read(key).num_rows == anchor.messages
    assert catalog.closed_by(sealed.key) == ClosedBy.MESSAGES
    assert catalog.batch_location(sealed.key) == catalog.batch_dir(sealed.key)
    assert catalog.landed_files(whole.key) == [catalog.batch_path(whole.key)]
    assert len(list(catalog.iter_messages())) == 9
    row = catalog.read(whole.key).to_pylist()[0]
    restored = catalog.restored_body(
        row["body_location"], row["body_size"], row["body_sha256"], max_bytes=len(big)
    )
    assert restored == big
    assert catalog.anchor(batch_key(3)) is None  # the open batch is not landed yet

    assert _snapshot(tmp_path) == before


def test_a_batch_file_without_an_anchor_or_chain_metadata_is_refused_not_read(tmp_path):
    zone = LandingZone(tmp_path)
    landed = zone.writer.land(_messages(2))
    # A file someone else put where the next batch's file goes: Parquet with a chain_link
    # column, but no anchor beside it and no chain metadata in it.
    foreign = zone.catalog.batch_path(batch_key(2))
    pq.write_table(pa.table({"chain_link": ["ab" * 32] * 3}), foreign)
    with pytest.raises(ValueError, match="not a landing file"):
        Catalog(tmp_path).tail()
    foreign.unlink()
    assert Catalog(tmp_path).tail().seq == int(landed.key)
