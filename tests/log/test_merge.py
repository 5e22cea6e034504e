"""Merging a sealed batch's parts into one file (sis_platform/log/landing/merge.py) on a signed
landing zone in tmp_path: the batch reads identically and verifies, the open batch is never
merged, parts that do not verify are never merged, the parts stay for their grace, and the log
goes on after a merge."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sis_platform.intake.lease import ConsumerLease
from sis_platform.log.landing import LANDING_SCHEMA, ClosedBy, GroupWriter, batch_key
from sis_platform.log.landing.merge import (
    MERGED_PARTS_KEY,
    Merger,
    merge_batch,
    merge_zone,
    remove_parts,
)
from sis_platform.log.seal import LogTampered
from sis_platform.queues.base import FencedOff, ReceivedMessage, new_message_id
from tests.log.grouped import (
    NOW,
    chain_problems,
    land_in_groups,
    log_rows,
    read_back,
    sealed_zone,
)

B1, B2, B3 = batch_key(1), batch_key(2), batch_key(3)
HOUR = 3600.0


def test_a_merged_batch_is_one_file_that_reads_identically_and_verifies(tmp_path):
    zone = sealed_zone(tmp_path / "data")
    land_in_groups(zone, batches=2, groups=5, leave_open=False)
    before, logged = log_rows(zone), read_back(zone)
    holder, token = zone.catalog.lease_holder(B1), zone.catalog.fence_token(B1)

    merged = merge_batch(zone.upkeep, B1)

    assert merged is not None and (merged.parts, merged.messages) == (5, 7)
    assert zone.catalog.batch_files(B1) == [zone.catalog.batch_path(B1)]
    assert zone.catalog.batch_location(B1) == zone.catalog.batch_path(B1)
    assert log_rows(zone) == before  # the same rows in the same order, msg_seq and links
    assert zone.catalog.read(B1).equals(before[B1])
    assert read_back(zone) == logged
    assert chain_problems(zone) == []
    assert zone.catalog.anchor_from_file(B1) == zone.catalog.anchors.read(
        B1
    )  # the signed anchor, as landed
    assert zone.catalog.closed_by(B1) == ClosedBy.SECONDS
    assert (zone.catalog.lease_holder(B1), zone.catalog.fence_token(B1)) == (holder, token)
    assert pq.read_schema(zone.catalog.batch_path(B1)).metadata[MERGED_PARTS_KEY] == b"5"
    assert list(zone.catalog.tmp_dir.iterdir()) == []
    assert merge_batch(zone.upkeep, B1) is None  # merged already


def test_the_open_batch_is_never_merged_and_the_log_goes_on_after_a_merge(tmp_path):
    zone = sealed_zone(tmp_path / "data")
    land_in_groups(zone, batches=2, groups=3, leave_open=True)

    assert merge_zone(zone.upkeep, None, grace_seconds=0.0).merged == 2
    assert merge_batch(zone.upkeep, B3) is None
    assert not zone.catalog.batch_path(B3).is_file() and len(zone.catalog.parts(B3)) == 2
    assert [k for k in (B1, B2, B3) if zone.catalog.batch_dir(k).exists()] == [B3]

    # A restarted writer seals the open batch after the merged ones, and lands on.
    writer = GroupWriter(zone.writer)
    sealed = writer.recover()
    assert sealed is not None and sealed.key == B3
    writer.land([ReceivedMessage(new_message_id(), b"<n/>", NOW, 1)])
    writer.seal(ClosedBy.MESSAGES)
    assert zone.catalog.keys() == [B1, B2, B3, batch_key(4)]
    assert chain_problems(zone) == []


def test_parts_are_kept_for_their_grace_and_a_reader_that_listed_them_reads_the_batch_whole(
    tmp_path,
):
    zone = sealed_zone(tmp_path / "data")
    land_in_groups(zone, batches=1, groups=4, leave_open=False)
    listed = zone.catalog.batch_files(B1)  # a reader (a Spark job, a catch-up) listed the parts

    report = merge_zone(zone.upkeep, None, grace_seconds=HOUR)

    assert (report.merged, report.removed, report.kept) == (1, 0, 1)
    read = [pq.read_table(p, schema=LANDING_SCHEMA) for p in listed]
    assert pa.concat_tables(read).equals(zone.catalog.read(B1))
    assert merge_zone(zone.upkeep, None, grace_seconds=HOUR) == (0, 0, 1, [])
    assert merge_zone(zone.upkeep, None, grace_seconds=0.0) == (0, 1, 0, [])
    assert not zone.catalog.batch_dir(B1).exists()
    assert chain_problems(zone) == []


def test_parts_edited_after_sealing_are_not_merged_and_stay_as_evidence(tmp_path):
    zone = sealed_zone(tmp_path / "data")
    land_in_groups(zone, batches=2, groups=3, leave_open=False)
    part = zone.catalog.parts(B1)[1]
    table = pq.read_table(part)
    index = table.schema.get_field_index("delivery_count")
    edited = table.set_column(index, table.schema.field(index), pa.array([9, 9], pa.int32()))
    part.chmod(0o600)
    pq.write_table(edited, part)  # its metadata (the signed running anchor) kept

    with pytest.raises(LogTampered, match=r"batch 0000000001: not merged: .*merged file"):
        merge_batch(zone.upkeep, B1)
    assert not zone.catalog.batch_path(B1).is_file() and len(zone.catalog.parts(B1)) == 3
    assert list(zone.catalog.tmp_dir.iterdir()) == []
    report = merge_zone(zone.upkeep, None, grace_seconds=0.0)
    assert (report.merged, report.removed, report.refused) == (1, 1, [B1])
    assert zone.catalog.batch_files(B1) == zone.catalog.parts(B1)


def test_a_merger_whose_lease_was_taken_over_claims_nothing(tmp_path):
    zone = sealed_zone(tmp_path / "data")
    land_in_groups(zone, batches=1, groups=3, leave_open=False)
    prod = ConsumerLease(zone.catalog.root, "prod@test-host-a:101", 60.0)
    fence = prod.fence(prod.acquire())
    dr = ConsumerLease(zone.catalog.root, "dr@test-host-b:202", 60.0)
    prod.release()  # a switchover: DR takes the lease with the next token
    assert dr.holds(dr.acquire())

    with pytest.raises(FencedOff):
        merge_batch(zone.upkeep, B1, fence)
    assert not zone.catalog.batch_path(B1).is_file() and list(zone.catalog.tmp_dir.iterdir()) == []


def test_parts_of_a_batch_not_merged_are_never_removed(tmp_path):
    zone = sealed_zone(tmp_path / "data")
    land_in_groups(zone, batches=1, groups=3, leave_open=False)
    assert remove_parts(zone.upkeep, B1) is False
    assert len(zone.catalog.parts(B1)) == 3


def _turns(merger: Merger, done: Callable[[], bool], seconds: float) -> int:
    """How many turns `merger` takes until `done()` (at most 1,000)."""
    for turns in range(1, 1001):
        merger.turn(seconds)
        if done():
            return turns
    raise AssertionError("the merger never got there")


def test_a_merger_reads_a_batch_over_turns_claims_it_in_a_turn_of_its_own_and_removes_parts_later(
    tmp_path,
):
    zone = sealed_zone(tmp_path / "data")
    land_in_groups(zone, batches=2, groups=3, leave_open=True)
    before = log_rows(zone)
    clock = [0.0]
    merger = Merger(zone.upkeep, None, HOUR, wall_clock=lambda: clock[0])
    assert merger.pending == 2

    # No budget: one part read per turn, then the claim: four turns for three parts.
    assert _turns(merger, zone.catalog.batch_path(B1).is_file, seconds=0.0) == 4
    assert _turns(merger, zone.catalog.batch_path(B2).is_file, seconds=HOUR) == 2
    assert (
        merger.pending == 2
        and zone.catalog.batch_dir(B1).is_dir()
        and zone.catalog.batch_dir(B2).is_dir()
    )
    merger.turn(HOUR)
    assert zone.catalog.batch_dir(B1).is_dir()  # within the grace

    clock[0] = zone.catalog.batch_path(B2).stat().st_mtime + HOUR
    merger.turn(HOUR)
    assert not zone.catalog.batch_dir(B1).exists() and not zone.catalog.batch_dir(B2).exists()
    assert merger.pending == 0 and len(zone.catalog.parts(B3)) == 2  # the open batch untouched
    assert log_rows(zone) == before
    assert chain_problems(zone) == []


def test_a_merger_built_after_a_restart_finds_the_work_left(tmp_path):
    zone = sealed_zone(tmp_path / "data")
    land_in_groups(zone, batches=3, groups=2, leave_open=True)
    merge_batch(zone.upkeep, B1)
    merger = Merger(zone.upkeep, None, 0.0)
    assert merger.pending == 3  # B1's parts to remove, B2 and B3 to merge; not the open one
    _turns(merger, lambda: merger.pending == 0, seconds=HOUR)
    assert [k for k in (B1, B2, B3) if zone.catalog.batch_dir(k).exists()] == []
    assert zone.catalog.batch_files(batch_key(4)) == zone.catalog.parts(batch_key(4))
    assert chain_problems(zone) == []


def test_a_part_that_is_not_a_landing_part_is_refused_and_the_next_batch_merged(tmp_path):
    zone = sealed_zone(tmp_path / "data")
    land_in_groups(zone, batches=2, groups=3, leave_open=False)
    part = zone.catalog.parts(B1)[2]
    part.chmod(0o600)
    part.write_bytes(b"not parquet")
    with pytest.raises(LogTampered, match=r"part-00002.parquet: not a landing part"):
        merge_batch(zone.upkeep, B1)

    merger = Merger(zone.upkeep, None, HOUR)
    _turns(merger, zone.catalog.batch_path(B2).is_file, seconds=HOUR)
    assert not zone.catalog.batch_path(B1).is_file() and len(zone.catalog.parts(B1)) == 3
    assert merger.pending == 1  # B2's parts, within their grace
