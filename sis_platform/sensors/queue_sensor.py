"""The queue sensor: the Dagster adapter of intake (sis_platform/intake/tick.py).

Each tick counts the batch runs in flight in the Dagster instance, runs one intake tick (lease,
partial-file cleanup, backpressure, get/land/commit, anchor recovery) and turns its outcome into
Dagster's terms: the batches handed on become `batches` partitions, each with a run request
tagged with its anchored chain head and message count (so Dagster's database keeps a copy of
every anchor, sis_platform/log/chain.py), and the cursor moves to the last of them
(sis_platform/sensors/batch_runs.py, shared with the landed-batches sensor); a standby,
backpressure or an empty queue is a skip with its reason; an outage or a lost lease is a failed
tick (`dg.Failure`), visible in the UI.

The sensor is built by `build_queue_sensor`, so its interval comes from the settings the code
location is built with instead of the environment at import time.
"""

from __future__ import annotations

import dagster as dg

from sis_platform.assets.jobs import process_batch_job
from sis_platform.intake.consumer import BatchLimits
from sis_platform.intake.tick import Intake, IntakeLimits, TickOutcome, TickStatus
from sis_platform.resources.platform import FeedProcessingResource, LandingZoneResource
from sis_platform.resources.sources import QueueSourceResource
from sis_platform.runtime.faults import crash_point
from sis_platform.sensors.batch_runs import batches_result, runs_in_flight

SENSOR_NAME = "sportsdata_queue_sensor"


def build_queue_sensor(minimum_interval_seconds: int) -> dg.SensorDefinition:
    """The queue sensor, evaluated at most every `minimum_interval_seconds` (the floor of a
    message's latency from the queue to its master)."""

    @dg.sensor(
        name=SENSOR_NAME,
        job=process_batch_job,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Gets a bounded batch from the Sportsdata queue under syncpoint, lands it "
        "durably, commits the queue, then registers the batch as a partition and requests its "
        "run.",
    )
    def sportsdata_queue_sensor(
        context: dg.SensorEvaluationContext,
        queue: QueueSourceResource,
        landing: LandingZoneResource,
        processing: FeedProcessingResource,
    ) -> dg.SensorResult | dg.SkipReason:
        intake = _intake(context, queue, landing, processing)
        registered = int(context.cursor) if context.cursor else 0
        runs = runs_in_flight(context.instance, landing.max_runs_in_flight)
        outcome = intake.tick(runs, registered=registered)
        if outcome.landed is not None:
            crash_point("sensor.after_commit")
        return _sensor_result(context.instance, outcome)

    return sportsdata_queue_sensor


def _intake(
    context: dg.SensorEvaluationContext,
    queue: QueueSourceResource,
    landing: LandingZoneResource,
    processing: FeedProcessingResource,
) -> Intake:
    """Intake as the resources configure it, reporting to the tick's log."""
    limits = IntakeLimits(
        max_runs_in_flight=landing.max_runs_in_flight,
        batch=BatchLimits(
            max_messages=landing.max_messages,
            max_bytes=landing.max_bytes,
            max_seconds=landing.max_seconds,
            get_wait_seconds=landing.get_wait_seconds,
        ),
        message=processing.limits(),
    )
    return Intake(queue.open(), landing.zone(), landing.lease(), limits, log=context.log)


def _sensor_result(
    instance: dg.DagsterInstance, outcome: TickOutcome
) -> dg.SensorResult | dg.SkipReason:
    """The outcome in Dagster's terms (see the module docstring)."""
    if outcome.failed:
        raise dg.Failure(description=outcome.detail) from outcome.error
    if outcome.status is not TickStatus.BATCHES:
        return dg.SkipReason(outcome.detail)
    return batches_result(instance, [[b] for b in outcome.batches])
