"""Run retention: finished runs older than SIS_RUN_RETAIN_DAYS, with their event logs, deleted
from Dagster's storage a bounded chunk per tick (docs/operations.md, "Dagster's partitions and
runs"). A batch run a day of the feed is 720 runs and some tens of thousands of event rows.

Which runs go: finished (success, failure, canceled; never queued, starting or running)
and created more than the window before the newest run was (the runs' own times: an idle
instance deletes nothing more however long it waits, a clock stepped back deletes nothing
early). Oldest first, at most RUN_CHUNK a tick.

Which are kept whatever their age: the run that holds each asset's latest materialization.
The platform reads Dagster's event log in one place, the lake's fold position (the latest
master_documents materialization, sis_platform/sensors/live_check_sensor.py), and the
freshness policies and the UI read each asset's latest materialization; those survive an
instance whose feed stopped for longer than the window. The sensors' cursors are not events.
A retired run's run-key (`batch-<key>`) could be requested again, but no sensor requests a key
behind its cursor. The anchored chain heads the feed's runs were tagged with go with them:
`sis-verify-log` then compares the log with its anchors, signatures and witness alone for those
batches.

Each run's captured step output (compute logs) and event log are deleted before its run record
(crash point
`retention.run_events_deleted` between the two): a tick killed there leaves a finished run
without events, which the next tick deletes; the other order would leave events of no run,
which nothing would find again.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import dagster as dg

from sis_platform.runtime.faults import crash_point

RUN_RETENTION_SENSOR_NAME = "run_retention_sensor"
RUN_CHUNK = 100
RUN_RETENTION_INTERVAL_SECONDS = 60
EVENTS_DELETED_POINT = "retention.run_events_deleted"
FINISHED = [
    dg.DagsterRunStatus.SUCCESS,
    dg.DagsterRunStatus.FAILURE,
    dg.DagsterRunStatus.CANCELED,
]


def build_run_retention_sensor(
    retain_days: float, minimum_interval_seconds: int = RUN_RETENTION_INTERVAL_SECONDS
) -> dg.SensorDefinition:
    """The sensor deleting finished runs older than `retain_days`."""
    window = timedelta(days=retain_days)

    @dg.sensor(
        name=RUN_RETENTION_SENSOR_NAME,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Deletes finished runs (and their event logs) created more than "
        f"{retain_days:g} day(s) before the newest run (SIS_RUN_RETAIN_DAYS), {RUN_CHUNK} a "
        "tick; the run of each asset's latest materialization is kept.",
    )
    def run_retention_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        deleted = delete_old_runs(context.instance, window, RUN_CHUNK)
        if not deleted:
            return dg.SensorResult(
                skip_reason=f"no finished run created more than {retain_days:g} day(s) before "
                "the newest run, but those holding an asset's latest materialization"
            )
        context.log.info(f"deleted {len(deleted)} finished run(s) and their event logs")
        return dg.SensorResult()

    return run_retention_sensor


def retention_cutoff(instance: dg.DagsterInstance, window: timedelta) -> datetime | None:
    """Runs created before this are old: the newest run's creation time less `window` (None:
    no run)."""
    newest = instance.get_run_records(limit=1, order_by="create_timestamp", ascending=False)
    if not newest:
        return None
    return newest[0].create_timestamp - window


def kept_runs(instance: dg.DagsterInstance) -> set[str]:
    """The runs holding an asset's latest materialization (runless ones have no run)."""
    latest = instance.get_latest_materialization_events(instance.get_asset_keys())
    return {event.run_id for event in latest.values() if event is not None and event.run_id}


def delete_old_runs(instance: dg.DagsterInstance, window: timedelta, chunk: int) -> list[str]:
    """One bounded step: up to `chunk` of the oldest finished runs past the window, but the
    kept ones, deleted with their event logs; their ids."""
    cutoff = retention_cutoff(instance, window)
    if cutoff is None:
        return []
    kept = kept_runs(instance)
    records = instance.get_run_records(
        dg.RunsFilter(statuses=FINISHED, created_before=cutoff),
        limit=chunk + len(kept),
        order_by="create_timestamp",
        ascending=True,
    )
    victims = [r.dagster_run.run_id for r in records if r.dagster_run.run_id not in kept][:chunk]
    for run_id in victims:
        # Its steps' captured output first (local files on the default instance): a run
        # record left behind still names what to delete.
        instance.compute_log_manager.delete_logs(prefix=[run_id])
        instance.event_log_storage.delete_events(run_id)
        crash_point(EVENTS_DELETED_POINT)
        instance.delete_run(run_id)
    return victims
