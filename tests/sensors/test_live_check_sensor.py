"""The sensor requesting the live == lake check (sis_platform/sensors/live_check_sensor.py) on
an ephemeral Dagster instance: the lake's fold position comes from master_documents'
materializations, as the fold records it (no Spark involved)."""

from __future__ import annotations

import dagster as dg
import pytest

from sis_platform.assets.jobs import live_matches_lake_job
from sis_platform.definitions import build_definitions
from sis_platform.lake.tables import MASTER_DOCUMENTS
from sis_platform.sensors.live_check_sensor import build_live_check_sensor

pytestmark = [pytest.mark.dagster]


def _folded_to(instance: dg.DagsterInstance, batch: int) -> None:
    instance.report_runless_asset_event(
        dg.AssetMaterialization(MASTER_DOCUMENTS.name, metadata={"last_batch": str(batch)})
    )


def test_no_second_check_run_is_requested_while_one_is_in_flight(tmp_path):
    """While the lake catches up, the check's runs wait behind the feed's: one queued check
    is enough (it checks the lake as it is when it runs), so the sensor requests no more
    until it has run."""
    instance = dg.DagsterInstance.ephemeral()
    sensor = build_live_check_sensor()
    _folded_to(instance, 3)
    first = sensor(dg.build_sensor_context(instance=instance))
    assert isinstance(first, dg.SensorResult)
    assert [r.run_key for r in first.run_requests or []] == ["live-matches-lake-3"]

    job = build_definitions({"SIS_DATA_DIR": str(tmp_path)}).resolve_job_def(
        live_matches_lake_job.name
    )
    in_flight = instance.create_run_for_job(job, status=dg.DagsterRunStatus.STARTED)
    _folded_to(instance, 4)
    held = sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor))
    assert isinstance(held, dg.SensorResult) and not held.run_requests
    assert "already queued or running" in (held.skip_reason.skip_message or "")  # type: ignore[union-attr]

    instance.report_run_canceled(in_flight)  # it ended: the next check is due
    again = sensor(dg.build_sensor_context(instance=instance, cursor=held.cursor or first.cursor))
    assert isinstance(again, dg.SensorResult)
    assert [r.run_key for r in again.run_requests or []] == ["live-matches-lake-4"]
