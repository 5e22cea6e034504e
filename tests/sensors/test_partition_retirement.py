"""Partition retirement against a real landing zone (sealed by GroupWriter, as sis-live seals),
a real serving store holding the live == lake gate and a real Dagster instance: exactly the
batches old enough and checked leave the partition set, never one past the gate, in bounded
chunks, none the landed-batches sensor then registers again, and none a queued run is for."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import pytest

from sis_platform.log.landing import ClosedBy, GroupWriter, LandingZone, batch_key
from sis_platform.log.landing.expiry import advance_record, remove_expired
from sis_platform.log.landing.merge import merge_zone
from sis_platform.resources import config
from sis_platform.sensors import partition_retirement
from sis_platform.sensors.partition_retirement import (
    build_partition_retirement_sensor,
    retirable_through,
)
from tests.harness import received
from tests.sensors.test_landed_sensor import Ticker

pytestmark = [pytest.mark.dagster]

DAY = 86_400.0


def _seal(zone: LandingZone, count: int) -> list[str]:
    writer = GroupWriter(zone.writer)
    keys = []
    for i in range(count):
        writer.land([received(f"<m n='{i}'/>".encode())])
        sealed = writer.seal(ClosedBy.MESSAGES)
        assert sealed is not None
        keys.append(sealed.key)
    return keys


def _date(zone: LandingZone, key: str, days_ago: float, now: float) -> None:
    """Batch `key` sealed `days_ago` before `now` (its anchor file's time is its seal time)."""
    at = now - days_ago * DAY
    os.utime(zone.catalog.anchors.path(key), (at, at))


class Site:
    """A landing zone of `count` sealed batches, all registered, dated by `ages` (days before the
    last one), with the retirement sensor and the landed-batches sensor over one instance."""

    def __init__(
        self,
        tmp_path: Path,
        ages: list[float],
        *,
        live: bool = True,
        store: bool = True,
        instance: dg.DagsterInstance | None = None,
    ) -> None:
        env = {"SIS_DATA_DIR": str(tmp_path)}
        self.resources = config.resources(env)
        self.zone: LandingZone = self.resources["landing"].zone()  # type: ignore[attr-defined]
        self.keys = _seal(self.zone, len(ages))
        now = self.zone.catalog.anchors.path(self.keys[-1]).stat().st_mtime
        for key, age in zip(self.keys, ages, strict=True):
            _date(self.zone, key, age, now)
        self.instance = instance or dg.DagsterInstance.ephemeral()
        self.instance.add_dynamic_partitions("batches", self.keys)
        if live and store:
            # sis-live's store, where the gate is read (a reader cannot create it).
            self.resources["serving"].open_writer().close()  # type: ignore[attr-defined]
        self.sensor = build_partition_retirement_sensor(30, live=live)
        self.cursor: str | None = None
        # The landed-batches sensor on the same instance, as the daemon ticks it.
        self.landed = Ticker(self.resources, self.instance)

    def check(self, batch_seq: int) -> None:
        """live_matches_lake passed at `batch_seq`, as the check records it."""
        store = self.resources["serving"].open_writer()  # type: ignore[attr-defined]
        try:
            store.record_checked(batch_seq)
        finally:
            store.close()

    def tick(self) -> dg.SensorResult:
        context = dg.build_sensor_context(
            instance=self.instance, cursor=self.cursor, resources=self.resources
        )
        result = self.sensor(context)
        assert isinstance(result, dg.SensorResult)
        assert not result.dynamic_partitions_requests and not result.run_requests
        if result.cursor is not None:
            self.cursor = result.cursor
        return result

    def registered(self) -> list[str]:
        return list(self.instance.get_dynamic_partitions("batches"))


def test_retires_exactly_the_batches_past_the_window_and_checked(tmp_path):
    # Batches 1-4 sealed 40 to 31 days before the last, 5-8 within 30 days of it.
    site = Site(tmp_path, [40, 35, 32, 31, 29, 10, 1, 0])
    site.check(8)
    result = site.tick()
    assert result.skip_reason is None
    assert site.cursor == "4"
    assert site.registered() == site.keys[4:]
    # The data stays: every batch's file and anchor are where they were.
    assert all(site.zone.catalog.anchors.read(k) is not None for k in site.keys)
    assert all(site.zone.catalog.landed_files(k) for k in site.keys)
    again = site.tick()
    assert "retired through 4" in _skipped(again)
    assert site.registered() == site.keys[4:]


def test_never_retires_a_batch_past_the_live_lake_gate(tmp_path):
    site = Site(tmp_path, [100, 97, 80, 70, 65, 0])
    # Not checked at all yet: nothing goes, however old.
    unchecked = site.tick()
    assert "gate: none" in _skipped(unchecked)
    assert site.registered() == site.keys
    # Checked at batch 5, sealed 65 days before the last: batches 1 and 2 are more than 30 days
    # older than the gate batch; 3 and 4 are not (the window counts back from the gate's seal).
    site.check(5)
    site.tick()
    assert site.registered() == site.keys[2:]
    site.check(6)
    site.tick()
    assert site.registered() == site.keys[5:]  # batch 6 is the gate itself: never older
    assert site.cursor == "5"


def test_before_sis_live_has_created_its_store_nothing_is_checked_and_nothing_retired(tmp_path):
    site = Site(tmp_path, [100, 97, 0], store=False)
    assert "gate: none" in _skipped(site.tick())
    assert site.registered() == site.keys


def test_in_sensor_intake_the_gate_is_the_lake_fold_position(tmp_path):
    site = Site(tmp_path, [100, 60, 20, 0], live=False)
    assert "gate: none" in _skipped(site.tick())  # no fold step recorded yet
    site.instance.report_runless_asset_event(
        dg.AssetMaterialization("master_documents", metadata={"last_batch": "2"})
    )
    site.tick()  # batch 1 sealed 40 days before the fold's batch 2
    assert site.registered() == site.keys[1:]


def test_a_tick_retires_a_bounded_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(partition_retirement, "RETIRE_CHUNK", 3)
    site = Site(tmp_path, [40] * 7 + [0])
    site.check(8)
    counts = []
    while site.tick().skip_reason is None:
        counts.append(len(site.registered()))
    assert counts == [5, 2, 1]
    assert site.cursor == "7"


def test_a_retired_key_is_not_registered_again(tmp_path):
    site = Site(tmp_path, [40, 40, 0])
    first = site.landed.tick()  # a new deployment: starts after the last key registered
    assert isinstance(first, dg.SkipReason)
    site.check(3)
    site.tick()
    assert site.registered() == [site.keys[2]]
    # A fresh landed-batches sensor (its cursor lost) still starts after the last key, which is
    # never retired; and one with its cursor registers only what is sealed next.
    site.landed.cursor = None
    assert isinstance(site.landed.tick(), dg.SkipReason)
    _seal(site.zone, 1)
    result = site.landed.tick()
    assert isinstance(result, dg.SensorResult)
    assert [r.partition_key for r in result.run_requests or []] == [batch_key(4)]
    assert site.registered() == [site.keys[2], batch_key(4)]


def test_a_run_in_flight_for_an_old_batch_holds_retirement_back_from_it(tmp_path):
    site = Site(tmp_path, [40, 40, 40, 40, 0])
    site.check(5)
    run = site.instance.create_run_for_job(
        _backfill_job,
        status=dg.DagsterRunStatus.STARTED,
        tags={"dagster/partition": batch_key(3)},
    )
    site.tick()
    assert site.registered() == site.keys[2:]  # 1 and 2 go; 3, its run in flight, stays
    held = site.tick()
    assert "batch 3 is queued or running" in _skipped(held)
    site.instance.report_run_failed(run)
    site.tick()
    assert site.registered() == site.keys[4:]


def test_a_range_run_in_flight_holds_retirement_back_from_its_first_batch(tmp_path):
    site = Site(tmp_path, [40, 40, 40, 40, 0])
    site.check(5)
    site.instance.create_run_for_job(
        _backfill_job,
        status=dg.DagsterRunStatus.STARTED,
        tags={
            "dagster/asset_partition_range_start": batch_key(2),
            "dagster/asset_partition_range_end": batch_key(4),
        },
    )
    site.tick()
    assert site.registered() == site.keys[1:]  # 1 goes; 2..4, its range in flight, stay


def test_a_batch_without_a_seal_time_stops_retirement_before_it():
    sealed = {1: 0.0, 2: 1.0, 4: 2.0}
    assert retirable_through(0, 4, sealed.get, cutoff=10.0) == 2
    assert retirable_through(0, 4, sealed.get, cutoff=1.0) == 1
    assert retirable_through(2, 2, sealed.get, cutoff=10.0) == 2


def _skipped(result: dg.SensorResult) -> str:
    assert result.skip_reason is not None
    return result.skip_reason.skip_message or ""


@dg.op
def _noop() -> None:
    pass


@dg.job
def _backfill_job() -> None:
    _noop()


def test_batches_expired_from_the_landing_zone_are_retired_whatever_their_age(tmp_path):
    """Landing expiry (log/landing/expiry.py) removes a batch's file and anchor, which this
    sensor dates batches by: an expired batch was checked and is past the landing retention,
    and can no longer be materialized, so its key goes instead of stopping retirement."""
    site = Site(tmp_path, [3, 2, 1, 0])
    merge_zone(site.zone.upkeep, None, grace_seconds=0.0)
    assert advance_record(site.zone.upkeep, checked_batch=2, retain_seconds=0.0).through_seq == 2
    assert remove_expired(site.zone.upkeep)
    site.check(3)
    result = site.tick()
    assert result.skip_reason is None
    assert site.registered() == site.keys[2:]
    site.check(4)
    assert "sealed less than" in _skipped(site.tick())  # batch 3: kept, and only a day old
    assert site.registered() == site.keys[2:]
