"""Notifications to the operator's webhook (SIS_NOTIFY_WEBHOOK_URL): every failed run, and every
failed asset check, posted as one JSON object each (sis_platform/runtime/webhook.py).

Two sensors, defined only when the webhook is configured:
- `notify_run_failures`, a run failure sensor: the job, run id, partition and Dagster's failure
  message;
- `notify_check_failures`: for each check of the code location, its failed executions since
  the last one posted (Dagster's per-check execution history, which every event log storage
  keeps, run-sharded SQLite included, and which holds the checks reported without a run too),
  oldest first, at most the newest `CHECKS_PER_TICK` per check and tick. Its cursor maps each
  check to the last execution posted.
Delivery is at least once: a receiver that cannot be reached, or answers other than 2xx, fails
the sensor's tick (shown in the UI's sensor page) without moving its cursor, and the next tick
posts again from there (what that tick posted before the failure is posted twice).
"""

from __future__ import annotations

import json
from typing import Any

import dagster as dg
from dagster._core.storage.asset_check_execution_record import (
    AssetCheckExecutionRecord,
    AssetCheckExecutionRecordStatus,
)

from sis_platform.assets.run_tags import PARTITION_TAG, run_batches
from sis_platform.runtime.webhook import Webhook
from sis_platform.settings import secret

RUN_FAILURE_SENSOR_NAME = "notify_run_failures"
CHECK_FAILURE_SENSOR_NAME = "notify_check_failures"
TOKEN_VARIABLE = "SIS_NOTIFY_WEBHOOK_TOKEN"
INTERVAL_SECONDS = 30
CHECKS_PER_TICK = 50  # evaluations read and posted per tick: a tick's work stays bounded
DESCRIPTION_CHARS = 2000  # of a failure message or check description posted


def webhook(url: str) -> Webhook:
    """The webhook at `url`, with the token the environment holds now (a secret: read at use)."""
    return Webhook(url, secret(TOKEN_VARIABLE))


def build_notify_sensors(
    url: str, minimum_interval_seconds: int = INTERVAL_SECONDS
) -> list[dg.SensorDefinition]:
    """The two sensors, posting to `url`."""

    @dg.run_failure_sensor(
        name=RUN_FAILURE_SENSOR_NAME,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Posts every failed run to the webhook SIS_NOTIFY_WEBHOOK_URL.",
    )
    def notify_run_failures(context: dg.RunFailureSensorContext) -> None:
        run = context.dagster_run
        webhook(url).post(
            {
                "kind": "run_failed",
                "job": run.job_name,
                "run_id": run.run_id,
                "partition": run.tags.get(PARTITION_TAG),
                # A run over a range of batches (a backlog) has a range instead of a partition.
                "partition_range": {"start": batches.first, "end": batches.last}
                if (batches := run_batches(run.tags)) and PARTITION_TAG not in run.tags
                else None,
                "message": (context.failure_event.message or "")[:DESCRIPTION_CHARS],
            }
        )

    @dg.sensor(
        name=CHECK_FAILURE_SENSOR_NAME,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Posts every failed asset check evaluation to the webhook "
        "SIS_NOTIFY_WEBHOOK_URL.",
    )
    def notify_check_failures(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        repository = context.repository_def
        assert repository is not None  # the daemon evaluates a sensor within its code location
        keys = sorted(repository.asset_graph.asset_check_keys, key=str)
        seen: dict[str, int] = json.loads(context.cursor) if context.cursor else {}
        storage = context.instance.event_log_storage
        hook = webhook(url)
        posted = 0
        for key in keys:
            name = key.to_user_string()
            if name not in seen:
                # A check seen for the first time: watched from its latest evaluation on, not
                # from the whole history of the instance.
                latest = storage.get_asset_check_execution_history(key, limit=1)
                seen[name] = latest[0].id if latest else 0
                continue
            failed = storage.get_asset_check_execution_history(
                key, limit=CHECKS_PER_TICK, status={AssetCheckExecutionRecordStatus.FAILED}
            )
            new = [r for r in reversed(failed) if r.id > seen[name]]
            for record in new:
                hook.post(failed_check_payload(record))
                seen[name] = record.id
                posted += 1
        cursor = json.dumps(seen, sort_keys=True)
        if not posted:
            return dg.SensorResult(skip_reason="no failed check since the last tick", cursor=cursor)
        context.log.info(f"posted {posted} failed check evaluation(s)")
        return dg.SensorResult(cursor=cursor)

    return [notify_run_failures, notify_check_failures]


def failed_check_payload(record: AssetCheckExecutionRecord) -> dict[str, Any]:
    """The JSON posted for one failed check execution."""
    event = record.event.dagster_event if record.event is not None else None
    data = event.event_specific_data if event is not None else None
    evaluation = data if isinstance(data, dg.AssetCheckEvaluation) else None
    return {
        "kind": "check_failed",
        "asset": record.key.asset_key.to_user_string(),
        "check": record.key.name,
        "severity": evaluation.severity.value if evaluation is not None else None,
        "partition": record.partition,
        "run_id": record.run_id or None,  # none: reported without a run
        "description": ((evaluation.description if evaluation else None) or "")[:DESCRIPTION_CHARS],
    }
