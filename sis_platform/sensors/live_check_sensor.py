"""The sensor that runs the live == lake check when the lake's fold has advanced.

`live_matches_lake` (sis_platform/assets/serving.py) reads all of master_documents with Spark,
so it is not a step of every batch run: at most every CHECK_INTERVAL_SECONDS this sensor reads
the lake's fold position from Dagster's event log (the `last_batch` of master_documents' latest
materialization, which every fold step records) and, when it is past the position last checked,
requests one run of `check_live_matches_lake` (run key per position: requested once). While
such a run is still queued or running it requests none: that run checks the lake as it is when
it runs, and the check's runs (the default priority) wait behind the feed's batch runs, so while
the lake catches up they would otherwise pile up in the run queue, one per position. It reads
neither the lake nor the store itself.
"""

from __future__ import annotations

import dagster as dg

from sis_platform.assets.jobs import live_matches_lake_job
from sis_platform.lake.tables import MASTER_DOCUMENTS
from sis_platform.sensors.batch_runs import IN_FLIGHT

LIVE_CHECK_SENSOR_NAME = "live_matches_lake_sensor"
CHECK_INTERVAL_SECONDS = 300


def build_live_check_sensor(
    minimum_interval_seconds: int = CHECK_INTERVAL_SECONDS,
) -> dg.SensorDefinition:
    """The sensor, evaluated at most every `minimum_interval_seconds`."""

    @dg.sensor(
        name=LIVE_CHECK_SENSOR_NAME,
        job=live_matches_lake_job,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Requests the live_matches_lake check when the lake's fold position has "
        "advanced since the last check (every few minutes at most).",
    )
    def live_matches_lake_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        checked = int(context.cursor) if context.cursor else 0
        folded = lake_fold_position(context.instance)
        if folded is None:
            return dg.SensorResult(
                skip_reason="no fold position recorded: the lake has not folded a batch yet, or "
                "its latest fold step folded none"
            )
        if folded <= checked:
            return dg.SensorResult(
                skip_reason=f"the lake's fold position (batch {folded}) is checked already"
            )
        if check_in_flight(context.instance):
            return dg.SensorResult(
                skip_reason=f"the lake has folded to batch {folded}; a check run is already "
                "queued or running and checks the lake as it is then"
            )
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    run_key=f"live-matches-lake-{folded}", tags={"sis/lake_batch": str(folded)}
                )
            ],
            cursor=str(folded),
        )

    return live_matches_lake_sensor


def lake_fold_position(instance: dg.DagsterInstance) -> int | None:
    """The last batch the lake's fold has committed, as its latest master_documents
    materialization records it (None: no fold step yet)."""
    event = instance.get_latest_materialization_event(dg.AssetKey(MASTER_DOCUMENTS.name))
    if event is None or event.asset_materialization is None:
        return None
    value = event.asset_materialization.metadata.get("last_batch")
    folded = getattr(value, "value", None)
    # Text since step and batch numbers stopped being plotted; an int in older materializations.
    if isinstance(folded, str) and folded.isdigit():
        return int(folded)
    return int(folded) if isinstance(folded, int) else None


def check_in_flight(instance: dg.DagsterInstance) -> bool:
    """Whether a run of the check's job is queued or running."""
    return bool(
        instance.get_run_records(
            dg.RunsFilter(job_name=live_matches_lake_job.name, statuses=IN_FLIGHT), limit=1
        )
    )
