from __future__ import annotations

from datetime import UTC, datetime

import pyarrow.parquet as pq
import pytest

from sis_platform.log.landing import (
    GENESIS_LINK,
    ClosedBy,
    LandingZone,
    MovedAside,
    batch_key,
    batch_seq_of,
    chain_link,
)
from sis_platform.queues.base import ReceivedMessage, new_message_id


def _messages(n: int, start: int = 0) -> list[ReceivedMessage]:
    now = datetime(2026, 11, 21, 14, 30, tzinfo=UTC)
    return [
        ReceivedMessage(new_message_id(), f"<m n='{start + i}'/>".encode(), now, 1 + (i % 2))
        for i in range(n)
    ]


def test_batches_are_numbered_without_gaps_and_keys_sort_in_landing_order(tmp_path):
    zone = LandingZone(tmp_path)
    keys = [zone.writer.land(_messages(3, i * 3)).key for i in range(12)]
    assert keys == sorted(keys) == zone.catalog.keys()
    assert [batch_seq_of(k) for k in keys] == list(range(1, 13))
    assert "," not in "".join(keys)


def test_landed_batch_holds_every_message_byte_exact_with_metadata(tmp_path):
    zone = LandingZone(tmp_path)
    msgs = _messages(5)
    batch = zone.writer.land(msgs)
    rows = zone.catalog.read(batch.key).to_pylist()
    assert [r["message_id"] for r in rows] == [m.message_id for m in msgs]
    assert [r["body"] for r in rows] == [m.body for m in msgs]
    assert [r["delivery_count"] for r in rows] == [m.delivery_count for m in msgs]
    assert [r["msg_seq"] for r in rows] == list(range(5))


def test_hash_chain_links_each_message_to_the_previous_batch(tmp_path):
    zone = LandingZone(tmp_path)
    zone.writer.land(_messages(2))
    zone.writer.land(_messages(3, 2))
    prev = GENESIS_LINK
    for key in zone.catalog.keys():
        for stored in zone.catalog.stored_messages(key):
            assert stored.prev_link == prev.hex()
            assert stored.record.body_sha256 == stored.row_body_sha256
            prev = chain_link(prev, stored.record)
            assert stored.chain_link == prev.hex()
    assert zone.catalog.last() == (2, prev)


def test_a_large_batch_is_landed_in_row_groups_spark_can_split(tmp_path, monkeypatch):
    # Spark reads a Parquet file with several tasks only if it has several row groups.
    monkeypatch.setattr("sis_platform.log.landing.rows.ROW_GROUP_BYTES", 16 * 1024)
    zone = LandingZone(tmp_path)
    msgs = _messages(400)
    large = zone.writer.land(msgs)
    single = zone.writer.land(_messages(1, 400))
    assert pq.ParquetFile(zone.catalog.batch_files(large.key)[0]).num_row_groups > 4
    assert pq.ParquetFile(zone.catalog.batch_files(single.key)[0]).num_row_groups == 1
    rows = zone.catalog.read(large.key).to_pylist()
    assert [r["message_id"] for r in rows] == [m.message_id for m in msgs]
    assert [r["msg_seq"] for r in rows] == list(range(400))
    prev = GENESIS_LINK
    for stored in zone.catalog.stored_messages(large.key):
        prev = chain_link(prev, stored.record)
        assert stored.chain_link == prev.hex()


def test_a_batch_is_counted_from_its_landing_file(tmp_path):
    zone = LandingZone(tmp_path)
    msgs = _messages(5)  # delivery counts 1, 2, 1, 2, 1
    later = datetime(2026, 11, 21, 15, 0, tzinfo=UTC)
    large = ReceivedMessage(new_message_id(), b"", later, 3)
    aside = MovedAside(large, zone.writer.move_aside(b"x" * 1000))
    key = zone.writer.land([*msgs, aside]).key
    figures = zone.catalog.figures(key)
    assert figures.messages == 6
    assert figures.body_bytes == sum(len(m.body) for m in msgs)  # the moved body is not held
    assert (figures.moved_aside, figures.redelivered) == (1, 3)
    assert (figures.first_put, figures.last_put) == (msgs[0].put_time, later)


def test_landing_never_overwrites_a_batch_landed_concurrently(tmp_path, monkeypatch):
    zone = LandingZone(tmp_path)
    zone.writer.land(_messages(1))
    stale = zone.catalog.last()
    LandingZone(tmp_path).writer.land(_messages(1, 1))  # another consumer lands batch 2 meanwhile
    monkeypatch.setattr(zone.catalog, "last", lambda: stale)  # we still believe batch 1 is the last
    with pytest.raises(FileExistsError):
        zone.writer.land(_messages(1, 2))
    assert len(zone.catalog.keys()) == 2
    assert list(zone.catalog.tmp_dir.iterdir()) == []


def test_partial_files_from_a_crash_are_not_batches_and_are_cleaned(tmp_path):
    zone = LandingZone(tmp_path)
    zone.writer.ensure()
    (zone.catalog.tmp_dir / f"{batch_key(1)}.parquet.123.partial").write_bytes(b"half a file")
    assert zone.catalog.keys() == []
    assert zone.writer.clean_partials() == 1
    assert zone.writer.land(_messages(1)).seq == 1


def test_landing_file_is_plain_parquet_readable_without_the_platform(tmp_path):
    zone = LandingZone(tmp_path)
    batch = zone.writer.land(_messages(4))
    assert pq.read_table(batch.path).num_rows == 4


def test_an_empty_batch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least one message"):
        LandingZone(tmp_path).writer.land([])


def test_why_a_batch_ended_is_kept_with_it(tmp_path):
    zone = LandingZone(tmp_path)
    recorded = zone.writer.land(_messages(2), closed_by=ClosedBy.SECONDS)
    unrecorded = zone.writer.land(_messages(1, 2))
    assert zone.catalog.closed_by(recorded.key) == ClosedBy.SECONDS
    assert zone.catalog.closed_by(unrecorded.key) is None
