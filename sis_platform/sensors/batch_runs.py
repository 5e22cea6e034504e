"""Batch runs in Dagster's terms, shared by both intake sensors (queue and landed batches).

A landed batch becomes a `batches` dynamic partition and one run request of the per-batch job,
requested once (`run_key` `batch-<key>`) and tagged with its anchored chain head and message
count, so Dagster's own database keeps a copy of every anchor (sis_platform/log/chain.py). The
sensor's cursor is the number of the last batch handed on. Runs in flight are counted here too:
both sensors hold back while enough of the feed's batch runs wait or run (a backfill's runs do
not count: they wait behind the feed's in the run queue).
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from sis_platform.assets.jobs import process_batch_job
from sis_platform.assets.message_log import CHAIN_HEAD_TAG, MESSAGES_TAG
from sis_platform.assets.partitions import BATCHES, batches_partitions
from sis_platform.intake.tick import ReadyBatch

BATCH_TAG = "sis/batch"
# Dagster's run queue launches higher priorities first (equal ones in submission order): the
# feed's batch runs go ahead of a backfill or replay queued before them (those run at the
# default 0), so re-materializing old partitions never makes the live feed wait behind it
# for more than the run in flight.
FEED_PRIORITY = {"dagster/priority": "10"}
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def runs_in_flight(instance: dg.DagsterInstance, limit: int) -> int:
    """The feed's batch runs queued or running, counted up to `limit` (all backpressure
    needs). Only runs at the feed's priority count: a backfill or replay of old batches (the
    default priority) must not hold back the feed's next run, which the run queue then starts
    ahead of the backfill's queued runs."""
    records = instance.get_run_records(
        dg.RunsFilter(job_name=process_batch_job.name, statuses=IN_FLIGHT, tags=FEED_PRIORITY),
        limit=max(limit, 1),
    )
    return len(records)


def batches_result(
    instance: dg.DagsterInstance, batches: Sequence[ReadyBatch], *, cursor: str | None = None
) -> dg.SensorResult:
    """`batches` (in landing order, at least one) registered as partitions where new, each
    with its run requested; the cursor moves to the last of them (`cursor`: as the sensor
    writes it; by default the last batch's number)."""
    if not batches:
        raise ValueError("a batch result needs at least one batch")
    # Probed one by one: listing every registered partition would grow with the log.
    new_keys = [b.key for b in batches if not instance.has_dynamic_partition(BATCHES, b.key)]
    return dg.SensorResult(
        run_requests=[batch_run_request(b) for b in batches],
        dynamic_partitions_requests=[batches_partitions.build_add_request(new_keys)]
        if new_keys
        else [],
        cursor=cursor if cursor is not None else str(batches[-1].seq),
    )


def batch_run_request(batch: ReadyBatch) -> dg.RunRequest:
    """The batch's run, requested once (`run_key`), at the feed's priority, tagged with its
    anchor when it has one."""
    tags = {BATCH_TAG: batch.key, **FEED_PRIORITY}
    if batch.anchor is not None:
        tags |= {CHAIN_HEAD_TAG: batch.anchor.head, MESSAGES_TAG: str(batch.anchor.messages)}
    return dg.RunRequest(partition_key=batch.key, run_key=f"batch-{batch.key}", tags=tags)
