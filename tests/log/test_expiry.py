"""Landing expiry (sis_platform/log/landing/expiry.py): which sealed batches go (only merged
ones, at or before the live == lake gate, older than the retention by the log's own clock,
never the newest), what the zone reads afterwards (the kept log, reached from the expiry
record's anchor; a clear error for anything older), and a SIGKILL at each crash point losing
nothing and finishing when run again."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from sis_platform.domain.limits import DEFAULT_LIMITS
from sis_platform.log.chain import Problem
from sis_platform.log.landing import START_POSITION, ClosedBy, GroupWriter, LandingZone, batch_key
from sis_platform.log.landing.expiry import (
    EXPIRY_RECORD,
    BatchExpired,
    Expirer,
    LogExpired,
    advance_record,
    expire_through,
    read_expiry,
    remove_expired,
)
from sis_platform.log.landing.merge import merge_zone
from sis_platform.log.landing.signed import signature_problems
from sis_platform.log.position import LogPosition
from sis_platform.queues.base import ReceivedMessage, new_message_id
from sis_platform.runtime.faults import ENV, EXPIRE_POINTS
from tests.live.processes import REPO, SIGKILLED
from tests.log.grouped import NOW, sealed_zone

DAY = 86400.0


def land_days(zone: LandingZone, days: int, *, merge: bool = True) -> None:
    """One sealed batch of three one-message groups per day, day 0 first, then an open batch;
    merged into one file each when `merge`."""
    writer = GroupWriter(zone.writer)
    for day in range(days + 1):
        for g in range(3):
            at = NOW + timedelta(days=day, seconds=g)
            writer.land(
                [ReceivedMessage(new_message_id(), f"<m d='{day}' g='{g}'/>".encode(), at, 1)],
                now=at,
            )
        if day < days:
            writer.seal(ClosedBy.SECONDS)
    if merge:
        merge_zone(zone.upkeep, None, grace_seconds=0.0)


def kept_chain_problems(zone: LandingZone) -> list[Problem]:
    """The chain check of every kept batch, the first one's from the expiry record's anchor."""
    from sis_platform.lake.spark.chain import verify_landing_file

    problems: list[Problem] = []
    keys = zone.catalog.keys()
    first = int(keys[0])
    previous = zone.catalog.anchor(batch_key(first - 1)) if first > 1 else None
    prev = previous.head if previous is not None else "00" * 32
    for key in keys:
        anchor = zone.catalog.anchor(key)
        assert anchor is not None and anchor.first_prev == prev
        problems += signature_problems(zone.catalog, key, anchor)
        problems += verify_landing_file(zone, key, prev, anchor)
        prev = anchor.head
    return problems


def messages(zone: LandingZone, after: LogPosition) -> list[tuple[LogPosition, bytes]]:
    return [(m.position, m.message.body) for m in zone.catalog.landed_after(after, DEFAULT_LIMITS)]


def test_only_merged_checked_batches_older_than_the_retention_and_not_the_newest_expire(tmp_path):
    zone = sealed_zone(tmp_path / "data")
    land_days(zone, 6)  # batches 1..6 on days 0..5, the open batch 7 on day 6
    # Retain 2.5 days by the log's clock: the newest sealed batch (6) is day 5, so days 0-2.
    assert advance_record(zone.upkeep, checked_batch=2, retain_seconds=2.5 * DAY).through_seq == 2
    assert advance_record(zone.upkeep, checked_batch=6, retain_seconds=2.5 * DAY).through_seq == 3
    # A gate past the newest sealed batch and no retention: the newest stays.
    assert advance_record(zone.upkeep, checked_batch=99, retain_seconds=0.0).through_seq == 5
    # The record never moves back.
    assert advance_record(zone.upkeep, checked_batch=1, retain_seconds=0.0).through_seq == 5
    assert read_expiry(zone.catalog.root).through_seq == 5  # type: ignore[union-attr]


def test_expire_through_removes_every_covered_batch_even_past_a_gap_and_never_moves_back(
    tmp_path,
):
    zone = sealed_zone(tmp_path / "data")
    land_days(zone, 5)
    anchor = zone.catalog.anchor(batch_key(3))
    assert anchor is not None
    # A zone that never held batch 2 (a history built in bulk): the removal does not stop at
    # the gap, as probing down from the record would.
    zone.catalog.batch_path(batch_key(2)).unlink()
    zone.catalog.anchors.path(batch_key(2)).unlink()
    expire_through(zone.upkeep, anchor)
    assert zone.catalog.expiry() == read_expiry(zone.catalog.root)
    assert zone.catalog.expiry().anchor == anchor  # type: ignore[union-attr]
    assert zone.catalog.keys() == [batch_key(4), batch_key(5)]
    assert not zone.catalog.batch_path(batch_key(1)).exists()
    assert zone.catalog.anchors.read(batch_key(1)) is None
    with pytest.raises(BatchExpired):
        zone.catalog.read(batch_key(1))
    assert kept_chain_problems(zone) == []
    earlier = zone.catalog.anchor(batch_key(3))
    assert earlier is not None
    with pytest.raises(ValueError, match="cannot move back"):
        expire_through(zone.upkeep, earlier)


def test_a_batch_still_in_parts_stops_the_expiry(tmp_path):
    zone = sealed_zone(tmp_path / "data")
    land_days(zone, 4, merge=False)
    assert advance_record(zone.upkeep, checked_batch=4, retain_seconds=0.0).through_seq == 0
    assert zone.catalog.expiry() is None


def test_the_zone_reads_the_kept_log_after_expiry_and_refuses_anything_older(tmp_path):
    zone = sealed_zone(tmp_path / "data")
    land_days(zone, 5)
    everything = messages(zone, START_POSITION)
    tail = zone.catalog.tail()
    assert advance_record(zone.upkeep, checked_batch=3, retain_seconds=0.0).through_seq == 3
    assert remove_expired(zone.upkeep)
    expiry = zone.catalog.expiry()
    assert expiry is not None and expiry.end == LogPosition(3, 2)

    assert zone.catalog.keys() == [batch_key(4), batch_key(5)]
    for seq in (1, 2, 3):
        assert not zone.catalog.batch_path(batch_key(seq)).exists()
        assert zone.catalog.anchors.read(batch_key(seq)) is None
        with pytest.raises(BatchExpired, match="raw_messages"):
            zone.catalog.read(batch_key(seq))
    assert zone.catalog.anchor(batch_key(3)) == expiry.anchor
    assert zone.catalog.tail() == tail
    # A reader at the end of the expired range goes on from the first kept message; one before
    # it is told why it cannot.
    assert messages(zone, expiry.end) == everything[9:]
    assert messages(zone, LogPosition(4, 0)) == everything[10:]
    for before in (START_POSITION, LogPosition(2, 2), LogPosition(3, 1)):
        with pytest.raises(LogExpired, match="restore a newer backup"):
            zone.catalog.landed_after(before, DEFAULT_LIMITS)
    assert zone.catalog.sealed_after(0, 10) == [batch_key(4), batch_key(5)]
    assert kept_chain_problems(zone) == []
    assert signature_problems(zone.catalog, batch_key(3), expiry.anchor) == []


def test_an_unreadable_expiry_record_is_an_error_not_an_empty_record(tmp_path):
    zone = sealed_zone(tmp_path / "data")
    land_days(zone, 2)
    (zone.catalog.root / EXPIRY_RECORD).write_text("{}")
    with pytest.raises(ValueError, match="not an expiry record"):
        zone.catalog.keys()


def test_the_expirer_removes_within_its_turns_and_looks_again_only_when_due(tmp_path):
    zone = sealed_zone(tmp_path / "data")
    land_days(zone, 5)
    now = [0.0]
    expirer = Expirer(zone.upkeep, None, 0.0, check_seconds=60.0, clock=lambda: now[0])
    expirer.turn(checked_batch=2)  # first turn: finish removals a crash may have left
    assert zone.catalog.expiry() is None
    expirer.turn(checked_batch=2)
    assert zone.catalog.keys()[0] == batch_key(3)
    expirer.turn(checked_batch=4)  # not due yet
    assert zone.catalog.keys()[0] == batch_key(3)
    now[0] = 61.0
    expirer.turn(checked_batch=4)
    assert zone.catalog.keys()[0] == batch_key(5)


# Expiry of the zone under data_dir (argv[1]) through batch 3, removed at once.
EXPIRE = """
import sys
from pathlib import Path
from sis_platform.log.landing.expiry import advance_record, remove_expired
from tests.log.grouped import sealed_zone
zone = sealed_zone(Path(sys.argv[1]))
advance_record(zone.upkeep, checked_batch=3, retain_seconds=0.0)
remove_expired(zone.upkeep)
"""


@pytest.mark.faults
@pytest.mark.timeout(300)
@pytest.mark.parametrize("point", EXPIRE_POINTS)
def test_expiry_killed_at_a_crash_point_loses_nothing_and_finishes_when_run_again(
    tmp_path: Path, point: str
) -> None:
    data = tmp_path / "data"
    zone = sealed_zone(data)
    land_days(zone, 5)
    everything = messages(zone, START_POSITION)

    env = {**os.environ, "PYTHONPATH": str(REPO), ENV: point}
    proc = subprocess.run([sys.executable, "-c", EXPIRE, str(data)], env=env, timeout=240)
    assert proc.returncode == SIGKILLED

    expiry = zone.catalog.expiry()
    assert expiry is not None and expiry.through_seq == 3  # the record is written first
    present = [zone.catalog.batch_path(batch_key(s)).exists() for s in (1, 2, 3)]
    assert present == ([True] * 3 if point == "expire.after_record" else [False, False, True])
    for state in ("killed", "expired again"):
        # Whatever is left under the record is invisible: the kept log reads whole.
        assert zone.catalog.keys() == [batch_key(4), batch_key(5)], state
        assert messages(zone, expiry.end) == everything[9:], state
        assert kept_chain_problems(zone) == [], state
        assert zone.catalog.tail().seq == 6, state
        advance_record(zone.upkeep, checked_batch=3, retain_seconds=0.0)
        assert remove_expired(zone.upkeep)
    for seq in (1, 2, 3):
        assert not zone.catalog.batch_path(batch_key(seq)).exists()
        assert not zone.catalog.anchors.path(batch_key(seq)).exists()
