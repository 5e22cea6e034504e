"""The lake's lag as sis-live computes it (sis_platform/live/lakelag.py) on a real landing zone:
sealed batches after the lake's last folded batch, the oldest unfolded message's landing (the
same as the lake_lag_within_bounds check's backlog), the open batch counted only in seconds, the
last snapshot kept while the store cannot say, and the store read no more often than asked."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sis_platform.live.lakelag import LakeWatch, newest_sealed
from sis_platform.log.landing import ClosedBy, GroupWriter, LandingZone
from sis_platform.log.landing.backlog import backlog_after
from sis_platform.log.landing.catalog import Catalog
from sis_platform.serving import LakeProgress
from tests.harness import received

AT = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _zone(tmp_path: Path) -> tuple[Catalog, GroupWriter]:
    """Three sealed batches of two messages, and an open fourth of one."""
    zone = LandingZone(tmp_path / "landing")
    writer = GroupWriter(zone.writer)
    writer.recover()
    for n in range(3):
        writer.land([received(f"<m n='{n}a'/>".encode()), received(f"<m n='{n}b'/>".encode())])
        writer.seal(ClosedBy.MESSAGES)
    writer.land([received(b"<m n='open'/>")])
    return zone.catalog, writer


def test_the_lag_counts_sealed_batches_and_the_oldest_unfolded_message(tmp_path: Path) -> None:
    zone, writer = _zone(tmp_path)
    landed, open_batch = zone.last_position(), writer.open_batch
    assert open_batch is not None and newest_sealed(landed, open_batch) == 3
    clock = Clock()
    watch = LakeWatch(zone, 5.0, clock)
    reads: list[LakeProgress | None] = [LakeProgress(2, 1, AT, 0)]
    watch.turn(lambda: reads[-1], landed, open_batch)
    lag = watch.current
    assert lag is not None and lag.batches == 2
    assert lag.oldest_waiting_at == backlog_after(zone, 1).oldest_landed_at is not None
    now = datetime.now(UTC) + timedelta(seconds=30)
    assert lag.seconds(now) == (now - lag.oldest_waiting_at).total_seconds()

    # Not due yet: the store is not read, whatever it says.
    reads.append(LakeProgress(3, 3, AT, 1))
    clock.now = 4.9
    watch.turn(lambda: reads[-1], landed, open_batch)
    assert watch.current is lag

    # Every sealed batch folded: none waits in batches; the open batch's message in seconds.
    clock.now = 5.0
    watch.turn(lambda: reads[-1], landed, open_batch)
    caught_up = watch.current
    assert caught_up is not None and caught_up.batches == 0
    assert caught_up.oldest_waiting_at == open_batch.opened_at.astimezone(UTC)

    # The store unavailable (or nothing recorded): the last snapshot stays.
    clock.now = 10.0
    watch.turn(lambda: None, landed, open_batch)
    assert watch.current is caught_up


def test_nothing_waits_when_the_lake_has_folded_everything_landed(tmp_path: Path) -> None:
    zone, writer = _zone(tmp_path)
    writer.seal(ClosedBy.MESSAGES)
    landed = zone.last_position()
    assert writer.open_batch is None and newest_sealed(landed, None) == 4
    watch = LakeWatch(zone, 5.0, Clock())
    watch.turn(lambda: LakeProgress(4, 4, AT, 2), landed, None)
    lag = watch.current
    assert lag is not None and (lag.batches, lag.oldest_waiting_at) == (0, None)
    assert lag.seconds(datetime.now(UTC)) == 0.0
