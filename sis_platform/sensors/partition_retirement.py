"""Partition retirement: the `batches` partitions of batches the lake folded and checked long ago
leave Dagster's partition set, so a year of the feed stays far under Dagster's guidance of
100,000 partitions per asset (docs/operations.md, "Dagster's partitions and runs").

Only Dagster's key goes: the batch's landing file, its anchor and its Delta rows stay, the fold
(unpartitioned) never reads the partition set, and `sis-batch-runs restore FROM TO`
(sis_platform/cli/batch_runs.py) registers a range again for a backfill from the UI.

A batch is retired when all of these hold:
- it is at or before the gate: the batch at which `live_matches_lake` last passed, as the
  serving store records it (`ServingReader.retention`, the gate of the store's own pruning; the
  check passes only at the lake's fold position, and the fold is gap-free up to it). With
  `SIS_INTAKE=sensor` there is no store and no check: the gate is the lake's fold position
  (the latest master_documents materialization's `last_batch`). No gate: nothing is retired;
- it was sealed more than SIS_PARTITION_RETAIN_DAYS before the gate batch was (the anchor
  files' own times: a clock stepped back retires nothing early, an idle feed retires nothing
  more);
- no queued or running run is for it or a later batch (a backfill launched from the UI).

The cursor is the number of the last batch retired through; each tick looks at most
RETIRE_CHUNK batches after it, oldest first, deletes the registered ones one by one, then moves
the cursor. A tick killed part way (crash point `retention.partition_retired`) leaves some keys
deleted and the cursor behind them: the next tick looks at the same batches, skips the keys
already gone and finishes. A key registered again at or before the cursor (a restore) is never
looked at again. The landed-batches sensor registers only batches after its own cursor, and
without one after the last key registered, which is never retired (the gate batch is not
older than itself), so nothing re-adds a retired key.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import dagster as dg

from sis_platform.assets.partitions import BATCHES
from sis_platform.assets.run_tags import run_batches
from sis_platform.log.landing import BATCH_KEY_RE, Catalog, batch_key, batch_seq_of
from sis_platform.log.landing.expiry import Expiry
from sis_platform.resources.platform import LandingZoneResource
from sis_platform.resources.serving import ServingStoreResource
from sis_platform.runtime.faults import crash_point
from sis_platform.sensors.batch_runs import IN_FLIGHT
from sis_platform.sensors.live_check_sensor import lake_fold_position
from sis_platform.serving import StoreNotReady

RETIREMENT_SENSOR_NAME = "batch_partition_retirement_sensor"
RETIRE_CHUNK = 500
RETIRE_INTERVAL_SECONDS = 60
RETIRED_POINT = "retention.partition_retired"
# Runs in flight read at most this many at once to find the oldest partition one is for; more
# (a backfill of thousands of batches queued) and the tick retires nothing.
IN_FLIGHT_READ = 1000


def build_partition_retirement_sensor(
    retain_days: float,
    *,
    live: bool,
    minimum_interval_seconds: int = RETIRE_INTERVAL_SECONDS,
) -> dg.SensorDefinition:
    """The sensor retiring `batches` partitions older than `retain_days`; gated by the serving
    store's live == lake record (`live`), else by the lake's fold position."""
    window = timedelta(days=retain_days)
    description = (
        "Retires `batches` partitions of batches folded and checked live == lake more than "
        f"{retain_days:g} day(s) ago (SIS_PARTITION_RETAIN_DAYS); the data stays."
    )
    if live:

        @dg.sensor(
            name=RETIREMENT_SENSOR_NAME,
            minimum_interval_seconds=minimum_interval_seconds,
            default_status=dg.DefaultSensorStatus.RUNNING,
            description=description,
        )
        def retire_checked(
            context: dg.SensorEvaluationContext,
            landing: LandingZoneResource,
            serving: ServingStoreResource,
        ) -> dg.SensorResult:
            def gate() -> int | None:
                try:
                    store = serving.open_reader()
                except StoreNotReady:  # sis-live has not created its store yet: none checked
                    return None
                try:
                    return store.retention().checked_batch or None
                finally:
                    store.close()

            return retire_tick(context, landing.catalog(), gate, window, "checked live == lake")

        return retire_checked

    @dg.sensor(
        name=RETIREMENT_SENSOR_NAME,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=description,
    )
    def retire_folded(
        context: dg.SensorEvaluationContext, landing: LandingZoneResource
    ) -> dg.SensorResult:
        return retire_tick(
            context,
            landing.catalog(),
            lambda: lake_fold_position(context.instance),
            window,
            "folded by the lake",
        )

    return retire_folded


# The seal time of a batch expired from the landing zone (`sealed_at`).
EXPIRED = -math.inf


def retire_tick(
    context: dg.SensorEvaluationContext,
    catalog: Catalog,
    gate_of: Callable[[], int | None],
    window: timedelta,
    gate_name: str,
) -> dg.SensorResult:
    """One tick: the cursor's next chunk of batches, the eligible ones' keys deleted."""
    through = int(context.cursor) if context.cursor else 0
    gate = gate_of()
    if gate is None or gate <= through:
        return dg.SensorResult(
            skip_reason=f"batches are retired through {through}; none after it is {gate_name} "
            f"yet (gate: {gate or 'none'})"
        )
    expiry = catalog.expiry()
    gate_sealed = sealed_at(catalog, batch_key(gate), expiry)
    if gate_sealed is None:
        return dg.SensorResult(
            skip_reason=f"batch {batch_key(gate)} ({gate_name}) has no anchor or file in the "
            "landing zone to date it by: nothing retired (sis-verify-log says more)"
        )
    held_from = oldest_in_flight(context.instance)
    if held_from is not None and held_from <= through + 1:
        held = f"batch {held_from}" if held_from else f"more than {IN_FLIGHT_READ} runs"
        return dg.SensorResult(
            skip_reason=f"a run for {held} is queued or running (a backfill?); batches are "
            f"retired through {through}, and no more until it has finished"
        )
    last = min(gate, through + RETIRE_CHUNK)
    if held_from is not None:
        last = min(last, held_from - 1)
    # A gate expired itself: everything up to it is expired, so everything up to it goes.
    cutoff = math.inf if gate_sealed == EXPIRED else gate_sealed - window.total_seconds()
    eligible = retirable_through(
        through, last, lambda s: sealed_at(catalog, batch_key(s), expiry), cutoff
    )
    if eligible == through:
        return dg.SensorResult(
            skip_reason=f"batches are retired through {through}; batch {through + 1} was "
            f"sealed less than {window / timedelta(days=1):g} day(s) before batch {gate} "
            f"({gate_name})"
        )
    retired = 0
    for seq in range(through + 1, eligible + 1):
        key = batch_key(seq)
        # Probed one by one: a key never registered (a batch landed by hand) or deleted by a
        # tick killed part way is skipped.
        if context.instance.has_dynamic_partition(BATCHES, key):
            context.instance.delete_dynamic_partition(BATCHES, key)
            retired += 1
            crash_point(RETIRED_POINT)
    context.log.info(
        f"retired {retired} `batches` partition(s) {batch_key(through + 1)}..{batch_key(eligible)}"
    )
    return dg.SensorResult(cursor=str(eligible))


def retirable_through(
    through: int, last: int, sealed: Callable[[int], float | None], cutoff: float
) -> int:
    """The last batch number after `through`, up to `last`, such that it and every batch before
    it was sealed before `cutoff` (seal times follow batch numbers); `through` when none. A
    batch without a seal time stops the run: its age is not known."""
    eligible = through
    for seq in range(through + 1, last + 1):
        at = sealed(seq)
        if at is None or at >= cutoff:
            break
        eligible = seq
    return eligible


def sealed_at(catalog: Catalog, key: str, expiry: Expiry | None) -> float | None:
    """When batch `key` was sealed: its anchor file's time (written once, at the seal), else
    its landing file's (a batch landed before anchors); None when it has neither. A batch
    expired from the landing zone (sis_platform/log/landing/expiry.py) has neither any more:
    it was checked live == lake and is past the landing's retention, and can no longer be
    materialized, so it counts as sealed at the dawn of time (EXPIRED). `expiry`: the zone's
    expiry record, read once per tick."""
    if expiry is not None and expiry.covers(key):
        return EXPIRED
    for path in (catalog.anchors.path(key), catalog.batch_path(key)):
        time = _mtime(path)
        if time is not None:
            return time
    return None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


def oldest_in_flight(instance: dg.DagsterInstance) -> int | None:
    """The oldest batch a queued or running run is for (None: none); 0 when too many runs are in
    flight to read them all (nothing may be retired then)."""
    records = instance.get_run_records(dg.RunsFilter(statuses=IN_FLIGHT), limit=IN_FLIGHT_READ + 1)
    if len(records) > IN_FLIGHT_READ:
        return 0
    # A run's batch, or the first of its range (a run over many batches).
    seqs = [
        batch_seq_of(batches.first)
        for r in records
        if (batches := run_batches(r.dagster_run.tags)) is not None
        and BATCH_KEY_RE.match(batches.first)
    ]
    return min(seqs, default=None)
