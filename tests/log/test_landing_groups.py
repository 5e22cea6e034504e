"""Batches landed in groups (sis_platform.log.landing.GroupWriter) on real files in tmp_path: the
rows and chain they hold, what a crash at each step leaves, the fence, and reading the log back from
a position (Catalog.landed_after)."""

from __future__ import annotations

import dataclasses
import os
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sis_platform.domain.limits import DEFAULT_LIMITS
from sis_platform.intake.lease import ConsumerLease
from sis_platform.log.chain import verify_messages
from sis_platform.log.landing import (
    GENESIS_LINK,
    START_POSITION,
    ClosedBy,
    GroupWriter,
    LandingZone,
    LogPosition,
    MovedAside,
    batch_key,
)
from sis_platform.log.landing import groups as groups_module
from sis_platform.log.landing import reading as reading_module
from sis_platform.log.landing.catalog import Catalog
from sis_platform.log.landing.layout import ZoneLayout
from sis_platform.queues.base import FencedOff, ReceivedMessage, new_message_id
from tests.clock import FakeClock

NOW = datetime(2026, 11, 21, 14, 30, tzinfo=UTC)
PROD = "prod@test-host-a:101"
DR = "dr@test-host-b:202"


def _messages(n: int, start: int = 0) -> list[ReceivedMessage]:
    return [
        ReceivedMessage(new_message_id(), f"<m n='{start + i}'/>".encode(), NOW, 1 + (i % 2))
        for i in range(n)
    ]


def _intact(zone: LandingZone, key: str) -> None:
    """The batch's stored messages follow its anchor from its first link to its head."""
    anchor = zone.catalog.anchors.read(key)
    assert anchor is not None
    report = verify_messages(
        key,
        zone.catalog.stored_messages(key),
        first_prev=anchor.first_prev,
        source="test",
        anchor=anchor,
    )
    assert report.intact, report.problems


class _Crash(Exception):
    """Stands for the process dying at a crash point."""


def _crash_at(monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    def crash(name: str) -> None:
        if name == point:
            raise _Crash(name)

    monkeypatch.setattr(groups_module, "crash_point", crash)


def test_a_batch_landed_in_groups_holds_the_rows_and_anchor_of_the_same_batch_landed_whole(
    tmp_path,
):
    messages = _messages(5)
    whole = LandingZone(tmp_path / "whole")
    whole.writer.land(_messages(2, 100), now=NOW)
    one_file = whole.writer.land(messages, now=NOW)
    grouped = LandingZone(tmp_path / "grouped")
    grouped.writer.land(_same(whole, batch_key(1)), now=NOW)
    writer = GroupWriter(grouped.writer)
    groups = [writer.land(messages[:2], now=NOW), writer.land(messages[2:4], now=NOW)]
    groups.append(writer.land(messages[4:], now=NOW))
    sealed = writer.seal(ClosedBy.MESSAGES)

    assert [(g.part, g.first_msg_seq, g.messages) for g in groups] == [
        (0, 0, 2),
        (1, 2, 2),
        (2, 4, 1),
    ]
    assert groups[-1].last_position == LogPosition(2, 4)
    assert sealed is not None
    assert (sealed.key, sealed.messages, sealed.last_link) == (
        one_file.key,
        5,
        one_file.last_link,
    )
    assert grouped.catalog.read(one_file.key).equals(whole.catalog.read(one_file.key))
    assert grouped.catalog.anchors.read(one_file.key) == whole.catalog.anchors.read(one_file.key)
    assert grouped.catalog.anchor_from_file(one_file.key) == grouped.catalog.anchors.read(
        one_file.key
    )
    assert grouped.catalog.batch_files(one_file.key) == [g.path for g in groups]
    assert grouped.catalog.batch_location(one_file.key) == grouped.catalog.batch_dir(one_file.key)
    assert grouped.catalog.closed_by(one_file.key) == ClosedBy.MESSAGES
    _intact(grouped, one_file.key)


def _same(zone: LandingZone, key: str) -> list[ReceivedMessage]:
    """The messages of a landed batch, as received (to land them again elsewhere)."""
    return [
        ReceivedMessage(str(r["message_id"]), bytes(r["body"]), r["put_time"], r["delivery_count"])
        for r in zone.catalog.read(key).to_pylist()
    ]


def test_landing_a_group_never_lists_the_zone(tmp_path, monkeypatch):
    zone = LandingZone(tmp_path)
    for i in range(3):
        zone.writer.land(_messages(2, i * 2))
    writer = GroupWriter(zone.writer)

    def listing(*args: object, **kwargs: object) -> object:
        raise AssertionError("the zone was listed while landing a group")

    for name in ("keys", "tail", "last", "last_position"):
        monkeypatch.setattr(Catalog, name, listing)
    for name in ("parts", "batch_files"):
        monkeypatch.setattr(ZoneLayout, name, listing)
    monkeypatch.setattr(Path, "glob", listing)
    monkeypatch.setattr(Path, "iterdir", listing)
    monkeypatch.setattr(os, "listdir", listing)
    monkeypatch.setattr(os, "scandir", listing)
    landed = [writer.land(_messages(1, 10 + i)) for i in range(4)]
    sealed = writer.seal(ClosedBy.SECONDS)
    landed.append(writer.land(_messages(2, 20)))
    monkeypatch.undo()

    assert sealed is not None and (sealed.key, sealed.messages) == (batch_key(4), 4)
    assert [g.last_position for g in landed] == [
        LogPosition(4, 0),
        LogPosition(4, 1),
        LogPosition(4, 2),
        LogPosition(4, 3),
        LogPosition(5, 1),
    ]
    assert zone.catalog.last_position() == LogPosition(5, 1)
    _intact(zone, batch_key(4))


def test_a_batch_left_open_by_a_crash_is_sealed_from_its_last_part_and_the_next_chains_on(
    tmp_path,
):
    zone = LandingZone(tmp_path)
    zone.writer.land(_messages(2))
    crashed = GroupWriter(zone.writer)
    crashed.land(_messages(2, 2))
    last = crashed.land(_messages(3, 4))  # then the process dies: no seal
    assert zone.catalog.keys() == [batch_key(1)]

    writer = GroupWriter(zone.writer)
    assert writer.open_batch is not None and writer.open_batch.messages == 5
    recovered = writer.recover()
    assert recovered is not None
    assert (recovered.key, recovered.messages, recovered.last_link) == (
        batch_key(2),
        5,
        last.last_link,
    )
    assert recovered.closed_by == ClosedBy.RECOVERED
    assert zone.catalog.closed_by(batch_key(2)) == ClosedBy.RECOVERED
    assert writer.open_batch is None
    assert writer.recover() is None  # nothing left open

    after = writer.land(_messages(1, 7))
    assert (after.batch_key, after.part, after.first_msg_seq) == (batch_key(3), 0, 0)
    writer.seal(ClosedBy.DRAINED)
    assert zone.catalog.keys() == [batch_key(1), batch_key(2), batch_key(3)]
    assert zone.catalog.anchors.read(batch_key(3)).first_prev == last.last_link  # type: ignore[union-attr]
    for key in zone.catalog.keys():
        _intact(zone, key)


def test_a_seal_interrupted_before_its_anchor_is_finished_with_the_recorded_reason(
    tmp_path, monkeypatch
):
    zone = LandingZone(tmp_path)
    writer = GroupWriter(zone.writer)
    writer.land(_messages(3))

    def lost(anchor: object) -> None:
        raise _Crash("before the anchor")

    monkeypatch.setattr(zone.writer.anchors, "write", lost)
    with pytest.raises(_Crash):
        writer.seal(ClosedBy.BYTES)
    monkeypatch.undo()
    assert zone.catalog.keys() == []  # a seal record alone does not make a batch landed
    assert zone.catalog.sealed_after(0, 10) == []

    recovered = GroupWriter(zone.writer).recover()
    assert recovered is not None and recovered.closed_by == ClosedBy.BYTES
    assert zone.catalog.keys() == [batch_key(1)]
    _intact(zone, batch_key(1))


def test_a_part_not_claimed_when_the_process_died_is_no_part_and_is_cleaned(tmp_path, monkeypatch):
    zone = LandingZone(tmp_path)
    writer = GroupWriter(zone.writer)
    first = writer.land(_messages(2))
    _crash_at(monkeypatch, "landing.before_claim")
    with pytest.raises(_Crash):
        writer.land(_messages(2, 2))
    monkeypatch.undo()
    assert len(list(zone.catalog.tmp_dir.glob("*.partial"))) == 1
    assert zone.catalog.last_position() == first.last_position
    assert zone.catalog.batch_files(batch_key(1)) == [first.path]

    fresh = GroupWriter(zone.writer)
    recovered = fresh.recover()
    assert list(zone.catalog.tmp_dir.glob("*.partial")) == []
    assert recovered is not None and recovered.messages == 2
    _intact(zone, batch_key(1))


def test_an_empty_folder_left_before_the_first_part_is_no_batch(tmp_path):
    zone = LandingZone(tmp_path)
    zone.writer.land(_messages(1))
    zone.catalog.batch_dir(batch_key(2)).mkdir()  # the folder was made, the process died
    assert zone.catalog.last_position() == LogPosition(1, 0)
    assert zone.catalog.keys() == [batch_key(1)]
    assert GroupWriter(zone.writer).recover() is None
    landed = GroupWriter(zone.writer).land(_messages(1, 1))
    assert landed.batch_key == batch_key(2)
    # In sensor mode, `land` seals the open batch before landing the next one whole.
    whole = zone.writer.land(_messages(1, 2))
    assert whole.seq == 3
    assert zone.catalog.closed_by(batch_key(2)) == ClosedBy.RECOVERED
    for key in zone.catalog.keys():
        _intact(zone, key)


def test_land_removes_an_empty_folder_of_the_number_it_takes(tmp_path):
    zone = LandingZone(tmp_path)
    zone.writer.ensure()
    zone.catalog.batch_dir(batch_key(1)).mkdir()
    batch = zone.writer.land(_messages(1))
    assert batch.key == batch_key(1)
    assert not zone.catalog.batch_dir(batch_key(1)).exists()
    assert zone.catalog.batch_files(batch.key) == [zone.catalog.batch_path(batch.key)]


def test_a_part_claimed_under_a_stale_fence_is_refused_and_lands_nothing(tmp_path):
    clock = FakeClock()
    zone = LandingZone(tmp_path)
    prod = ConsumerLease(tmp_path, PROD, 60, clock=clock)
    writer = GroupWriter(zone.writer, prod.fence(prod.acquire()))
    writer.land(_messages(2))
    clock.advance(61)
    dr = ConsumerLease(tmp_path, DR, 60, clock=clock)
    fresh = dr.fence(dr.acquire())
    with pytest.raises(FencedOff):
        writer.land(_messages(2, 2))
    with pytest.raises(FencedOff):
        writer.seal(ClosedBy.SECONDS)
    assert zone.catalog.last_position() == LogPosition(1, 1)
    assert list(zone.catalog.tmp_dir.iterdir()) == []
    assert zone.catalog.keys() == []

    taking_over = GroupWriter(zone.writer, fresh)
    recovered = taking_over.recover()
    assert recovered is not None and recovered.messages == 2
    assert zone.catalog.fence_token(batch_key(1)) == 1  # landed by prod
    assert zone.catalog.lease_holder(batch_key(1)) == PROD
    taking_over.land(_messages(1, 4))
    assert zone.catalog.fence_token(batch_key(2)) == 2
    assert zone.catalog.lease_holder(batch_key(2)) == DR


def test_sealed_after_and_keys_see_sealed_batches_only(tmp_path):
    zone = LandingZone(tmp_path)
    zone.writer.land(_messages(1))
    writer = GroupWriter(zone.writer)
    writer.land(_messages(2, 1))
    writer.seal(ClosedBy.MESSAGES)
    writer.land(_messages(1, 3))
    assert zone.catalog.keys() == [batch_key(1), batch_key(2)]
    assert zone.catalog.sealed_after(0, 10) == [batch_key(1), batch_key(2)]
    assert zone.catalog.sealed_after(0, 1) == [batch_key(1)]
    assert zone.catalog.sealed_after(2, 10) == []
    assert zone.writer.ensure_anchor(batch_key(3)) is None  # only its holder seals an open batch
    assert zone.catalog.closed_by(batch_key(3)) is None
    assert zone.catalog.last() == (3, bytes.fromhex(writer.open_batch.head))  # type: ignore[union-attr]
    assert zone.catalog.last_position() == LogPosition(3, 0)
    # A one-file batch whose anchor a crash did not write is landed all the same.
    zone.catalog.anchors.path(batch_key(1)).unlink()
    assert zone.catalog.sealed_after(0, 10) == [batch_key(1), batch_key(2)]


def test_landed_after_reads_the_log_from_any_position(tmp_path):
    zone = LandingZone(tmp_path)
    assert list(zone.catalog.landed_after(START_POSITION, DEFAULT_LIMITS)) == []
    assert zone.catalog.last_position() == START_POSITION == LogPosition.START  # type: ignore[attr-defined]
    whole = _messages(3)
    zone.writer.land(whole)
    writer = GroupWriter(zone.writer)
    grouped = _messages(5, 3)
    writer.land(grouped[:2])
    writer.land(grouped[2:4])
    writer.land(grouped[4:])
    writer.seal(ClosedBy.SECONDS)
    open_ = _messages(2, 8)
    writer.land(open_[:1])
    writer.land(open_[1:])
    ids = [m.message_id for m in whole + grouped + open_]

    def after(position: LogPosition) -> list[tuple[LogPosition, str]]:
        return [
            (m.position, m.message.message_id)
            for m in zone.catalog.landed_after(position, DEFAULT_LIMITS)
        ]

    everything = after(START_POSITION)
    assert [i for _, i in everything] == ids
    assert [p for p, _ in everything] == (
        [LogPosition(1, i) for i in range(3)]
        + [LogPosition(2, i) for i in range(5)]
        + [LogPosition(3, i) for i in range(2)]
    )
    assert after(LogPosition(1, 1)) == everything[2:]  # inside a one-file batch
    assert after(LogPosition(1, 2)) == everything[3:]  # the end of a one-file batch
    assert after(LogPosition(2, 2)) == everything[6:]  # inside a part
    assert after(LogPosition(2, 3)) == everything[7:]  # the end of a part
    assert after(LogPosition(2, 4)) == everything[8:]  # the end of a sealed batch, into the open
    assert after(zone.catalog.last_position()) == []
    landed = next(zone.catalog.landed_after(LogPosition(2, 0), DEFAULT_LIMITS))
    assert landed.put_time == NOW
    assert (landed.message.body, landed.message.delivery_count) == (grouped[1].body, 2)


def test_landed_after_reads_only_the_files_from_the_position_on(tmp_path, monkeypatch):
    zone = LandingZone(tmp_path)
    zone.writer.land(_messages(3))
    writer = GroupWriter(zone.writer)
    parts = [writer.land(_messages(2, 3 + 2 * i)).path for i in range(4)]
    read: list[Path] = []
    original = reading_module._read_file

    def recorded(zone: Catalog, path: Path, *args: object) -> object:
        read.append(path)
        return original(zone, path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(reading_module, "_read_file", recorded)
    assert len(list(zone.catalog.landed_after(LogPosition(2, 4), DEFAULT_LIMITS))) == 3
    assert read == parts[2:]
    read.clear()
    assert len(list(zone.catalog.landed_after(LogPosition(1, 2), DEFAULT_LIMITS))) == 8
    assert read == parts
    read.clear()
    assert list(zone.catalog.landed_after(LogPosition(2, 7), DEFAULT_LIMITS)) == []
    assert read == []


def test_landed_after_restores_a_moved_aside_body_when_the_limits_allow(tmp_path):
    zone = LandingZone(tmp_path)
    big = ReceivedMessage(new_message_id(), b"", NOW)
    aside = MovedAside(big, zone.writer.move_aside(b"<m>" + b"x" * 100 + b"</m>"))
    GroupWriter(zone.writer).land([aside])
    small = dataclasses.replace(DEFAULT_LIMITS, max_message_bytes=10)
    (kept,) = zone.catalog.landed_after(START_POSITION, small)
    assert (kept.message.body, kept.message.body_size) == (b"", 107)
    assert kept.message.body_location == aside.body.location
    (restored,) = zone.catalog.landed_after(START_POSITION, DEFAULT_LIMITS)
    assert restored.message.body == b"<m>" + b"x" * 100 + b"</m>"


def test_a_part_is_plain_parquet_carrying_its_batch_so_far(tmp_path):
    zone = LandingZone(tmp_path)
    writer = GroupWriter(zone.writer)
    first = writer.land(_messages(2))
    second = writer.land(_messages(3, 2))
    metadata = pq.read_schema(first.path).metadata
    assert metadata[b"sis:messages"] == b"2"
    assert metadata[b"sis:chain_first_prev"] == GENESIS_LINK.hex().encode()
    assert metadata[b"sis:chain_head"] == first.last_link.encode()
    assert pq.read_table(second.path).num_rows == 3
    assert pq.read_schema(second.path).metadata[b"sis:messages"] == b"5"
    assert oct(zone.catalog.batch_dir(first.batch_key).stat().st_mode & 0o777) == "0o700"
    assert oct(first.path.stat().st_mode & 0o777) == "0o600"


def test_a_land_that_failed_after_its_claim_is_not_claimed_twice(tmp_path, monkeypatch):
    zone = LandingZone(tmp_path)
    writer = GroupWriter(zone.writer)
    writer.land(_messages(1))
    failing = _messages(2, 1)

    def disk_error(path: Path) -> None:
        raise OSError("the folder's fsync failed")

    monkeypatch.setattr(groups_module, "fsync_dir", disk_error)
    with pytest.raises(OSError, match="fsync failed"):
        writer.land(failing)
    monkeypatch.undo()
    after = writer.land(_messages(1, 3))  # the group's part was claimed: this one follows it
    assert (after.part, after.first_msg_seq) == (2, 3)
    writer.seal(ClosedBy.SECONDS)
    ids = [m.message.message_id for m in zone.catalog.landed_after(START_POSITION, DEFAULT_LIMITS)]
    assert ids[1:3] == [m.message_id for m in failing]
    _intact(zone, batch_key(1))
